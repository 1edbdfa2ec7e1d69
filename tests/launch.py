"""Launch real multi-rank jobs (horovodrun --gloo or mpirun) from tests, with a hard time bound.

No mock: these are the launchers users run. The venv's bin folder goes first on PATH so that horovodrun's
ranks run the same interpreter as the tests.
"""
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "workers")
GUARDS = os.path.join(ROOT, "tests", "guards")   # sitecustomize.py: checks every launched job (see there)
BIN = os.path.dirname(sys.executable)
LAUNCHERS = ("horovodrun", "mpirun")


@dataclasses.dataclass
class Result:
    returncode: int
    output: str
    elapsed: float
    timed_out: bool

    def lines_with(self, text):
        return [ln for ln in self.output.splitlines() if text in ln]

    def rank_lines(self):
        """Lines printed by the ranks (the launchers prefix them: '[1]<stderr>:' or '[1,0]<stderr>:')."""
        return [ln for ln in self.output.splitlines() if re.match(r"^\[\d+(,\d+)?\]<std(out|err)>:", ln)]

    def stderr_of(self, *ranks):
        """Lines printed to stderr by the given ranks ('[1]<stderr>:' under horovodrun, '[1,1]<stderr>:' under
        mpirun)."""
        wanted = "|".join(str(r) for r in ranks)
        return [ln for ln in self.output.splitlines() if re.match(rf"^\[(\d+,)?({wanted})\]<stderr>:", ln)]


def command(launcher, np, script, args=()):
    script = script if os.path.isabs(script) else os.path.join(ROOT, script)
    if launcher == "horovodrun":
        return [os.path.join(BIN, "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
                sys.executable, script, *map(str, args)]
    if launcher == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--tag-output", "-np", str(np),
                sys.executable, script, *map(str, args)]
    raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")


@functools.lru_cache(maxsize=None)
def horovod_build() -> str:
    """Whether this Horovod was built with Gloo and with MPI, asked of Horovod's build once per test session, as
    "gloo=1,mpi=1": horovodrun in the jobs the tests launch answers its own build probe with it (tests/guards)."""
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch as h; print(int(h.gloo_built()), "
                            "int(h.mpi_built()))"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise RuntimeError(f"asking Horovod's build failed: {probe.stderr.strip()[-2000:]}")
    gloo, mpi = probe.stdout.split()
    return f"gloo={gloo},mpi={mpi}"


def job_env(env=None) -> dict:
    """The environment of a launched job: this one without any HVD_ELASTIC_* setting, the venv and this checkout
    first, Horovod's build (horovod_build), then `env`."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_")}
    full_env["HVDE_TEST_HOROVOD_BUILT"] = horovod_build()
    full_env.update({"PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1",
                     "PYTHONPATH": os.pathsep.join([ROOT, GUARDS, os.environ.get("PYTHONPATH", "")]),
                     "OMPI_MCA_rmaps_base_oversubscribe": "1", "HOROVOD_LOG_LEVEL": "warning",
                     # A rank waiting in an MPI call spins unless told to yield; here a job's ranks and their threads
                     # outnumber the cores (OpenMPI yields by itself only when it sees more ranks than slots)
                     "OMPI_MCA_mpi_yield_when_idle": "1",
                     # One compute thread per rank: a job's ranks outnumber the cores, and the OpenMP threads of
                     # PyTorch / TensorFlow ops spin after each parallel region, taking the CPU the other ranks need
                     "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"})
    full_env.update(env or {})
    return full_env


def launch(launcher, np, script, args=(), env=None, timeout=120) -> Result:
    """Run `script` on `np` ranks; kill the whole process group after `timeout` seconds."""
    return run(command(launcher, np, script, args), job_env(env), timeout)


def run(cmd, env, timeout) -> Result:
    """Run a command line from the repository root with `env`; kill its process group after `timeout` s. Each run
    gets an OpenMPI session directory of its own (OMPI_MCA_orte_tmpdir_base, unless `env` names one): mpiruns that
    start at once race to create the shared /tmp/ompi.<host>.<uid>, and the loser's orte_init fails ("File
    exists")."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hvde-ompi-", ignore_cleanup_errors=True) as session_dir:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={"OMPI_MCA_orte_tmpdir_base": session_dir, **env}, cwd=ROOT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
    return Result(proc.returncode, out, time.perf_counter() - t0, timed_out)


def selected(request, names):
    """Of `names` (test names of request's module), those of the tests this session runs, in their order."""
    chosen = [item.name for item in request.session.items if item.module is request.module]
    return [n for n in chosen if n in names]


@contextlib.contextmanager
def side_by_side(jobs: dict, parallel: int):
    """Run jobs that mostly wait (e.g. for a stall timeout) at most `parallel` at once: `jobs` maps a name
    to a callable returning a Result; yields name -> future of (Result, time.time() when the job ended). Leaving the
    block cancels the jobs not started and waits for the others."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=parallel)

    def timed(fn):
        res = fn()
        return res, time.time()

    try:
        yield {name: pool.submit(timed, fn) for name, fn in jobs.items()}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
