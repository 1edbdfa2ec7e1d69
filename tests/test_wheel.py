"""Packaging: the wheel built from this checkout holds the whole plugin, and a 2-rank job runs from it alone.

The editable install that ci/ and the other tests use hides a module missing from the wheel (a package folder
without __init__.py is skipped by setuptools' package discovery, yet imports fine from the checkout). Here:

1. the wheel is built (`pip wheel`, compiling native/) from a clean copy of the checkout's files -- what git tracks
   plus untracked files git does not ignore -- so that no in-place build (hvd_elastic/_native*.so, build/) can
   slip into it;
2. its file list must hold every module of hvd_elastic/, the native module and the package data;
3. it is installed into a scratch folder, and a real 2-rank mpirun job of a script outside the checkout, with
   PYTHONPATH = that folder only, imports every frontend and trains a tiny torch model under asp. Every rank
   reports where each hvd_elastic module came from (the venv's setuptools `__editable__` finder, which maps
   hvd_elastic and its submodules to this checkout, is taken out first, as a user's environment would not have
   it) and a hash of its final weights.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

from launch import BIN, ROOT

RANK_SCRIPT = r'''
import hashlib
import json
import sys

# No editable install of hvd-elastic where users install the wheel: drop setuptools' __editable__ finder (it maps
# hvd_elastic and every submodule to the checkout, so a module missing from the wheel would still import).
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not getattr(h, "__module__", "").startswith("__editable__")]
sys.path_importer_cache.clear()

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import hvd_elastic
import hvd_elastic.torch as hvde
import hvd_elastic.keras
import hvd_elastic.tensorflow

hvd.init()
rank = hvd.rank()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
opt = hvde.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
w0 = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()
g = torch.Generator().manual_seed(10 + rank)
for _ in range(20):
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
report = hvde.finish(opt)
w = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
modules = {}
for name in sorted(n for n in sys.modules if n == "hvd_elastic" or n.startswith("hvd_elastic.")):
    m = sys.modules[name]
    modules[name] = [getattr(m, "__file__", None)] + list(getattr(m, "__path__", None) or [])
digest = hashlib.sha256(w.tobytes()).hexdigest()
print(f"rank {rank}: hvd_elastic from {hvd_elastic.__file__}, final weights sha256 {digest}", flush=True)
with open(f"rank{rank}.json", "w") as f:
    json.dump({"file": hvd_elastic.__file__, "modules": modules, "policy": report["policy"],
               "steps": report["ranks"][rank]["steps"], "weights": digest,
               "initial_weights": hashlib.sha256(w0.tobytes()).hexdigest()}, f)
'''


def _sh(cmd, timeout, cwd=None, env=None):
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-6000:]}"
    return proc.stdout


def _copy_checkout(dest):
    """Copy the checkout's files (tracked, and untracked ones git does not ignore: a new module not yet added
    must not fail here) to `dest`; ignored files -- in-place builds, caches -- stay behind."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):                  # tracked but deleted in the working tree: not part of it
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def _rank_env(site):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVD_ELASTIC_") and k != "PYTHONPATH"}
    env.update({"PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": site, "PYTHONUNBUFFERED": "1",
                "PYTHONNOUSERSITE": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1", "HOROVOD_LOG_LEVEL": "warning",
                "OMPI_MCA_mpi_yield_when_idle": "1", "HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_REPORT": "0"})
    return env


def test_wheel_holds_the_plugin_and_runs_a_job_from_outside_the_checkout(tmp_path):
    src, dist, site, job = (str(tmp_path / d) for d in ("src", "dist", "site", "job"))
    _copy_checkout(src)
    assert not [f for f in os.listdir(os.path.join(src, "hvd_elastic")) if f.endswith(".so")]

    t0 = time.perf_counter()
    _sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, src],
        timeout=900, cwd=str(tmp_path))
    build_s = time.perf_counter() - t0
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    wheel = os.path.join(dist, wheels[0])
    print(f"wheel {wheels[0]} built in {build_s:.1f} s")

    # 2. The file list: every module of the package, the native module, the package data.
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    modules = {os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/")
               for d, _, fs in os.walk(os.path.join(src, "hvd_elastic")) for f in fs if f.endswith(".py")}
    assert modules >= {"hvd_elastic/__init__.py", "hvd_elastic/engine/engine.py"}
    assert sorted(modules - names) == [], "modules missing from the wheel"
    assert [n for n in names if n.startswith("hvd_elastic/engine/") and n.endswith(".py")]
    assert [n for n in names if re.fullmatch(r"hvd_elastic/_native[^/]*\.so", n)], sorted(names)
    assert {"hvd_elastic/py.typed", "hvd_elastic/_native.pyi"} <= names, sorted(names)
    assert not [n for n in names if n.startswith(("tests/", "native/", "ci/", "examples/", "docs/"))], sorted(names)
    # One version number: the wheel's is hvd_elastic.__version__.
    version = re.search(r'^__version__ = "([^"]+)"', open(os.path.join(src, "hvd_elastic", "__init__.py")).read(),
                        re.M).group(1)
    assert re.search(rf"^Version: {re.escape(version)}$", metadata, re.M), metadata[:600]
    requires = re.findall(r"^Requires-Dist: (.*)$", metadata, re.M)
    plain = sorted(r for r in requires if "extra ==" not in r)
    assert [r.replace(" ", "") for r in plain] == ["horovod==0.28.1", "numpy"], requires

    # 3. Install it into a scratch folder; a 2-rank job outside the checkout imports hvd_elastic from there only.
    _sh([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel], timeout=300,
        cwd=str(tmp_path))
    os.makedirs(job)
    script = os.path.join(job, "train_from_wheel.py")
    with open(script, "w") as f:
        f.write(RANK_SCRIPT)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
           sys.executable, script]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=job, env=_rank_env(site), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("the 2-rank job timed out:\n" + out[-6000:])
    print(f"2-rank job from the wheel: {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, out[-6000:]

    ranks = [json.load(open(os.path.join(job, f"rank{r}.json"))) for r in range(2)]
    real_site, real_root = os.path.realpath(site), os.path.realpath(ROOT)
    for rank, r in enumerate(ranks):
        assert os.path.realpath(r["file"]) == os.path.join(real_site, "hvd_elastic", "__init__.py"), (rank, r["file"])
        assert {"hvd_elastic.engine", "hvd_elastic._native", "hvd_elastic.torch", "hvd_elastic.keras",
                "hvd_elastic.tensorflow"} <= set(r["modules"]), sorted(r["modules"])
        for name, paths in r["modules"].items():
            for p in filter(None, paths):
                p = os.path.realpath(p)
                assert p.startswith(real_site + os.sep) and not p.startswith(real_root + os.sep), (rank, name, p)
        assert r["policy"] == "asp" and r["steps"] == 20, r
    assert ranks[0]["weights"] == ranks[1]["weights"], [r["weights"] for r in ranks]
    assert ranks[0]["initial_weights"] == ranks[1]["initial_weights"] != ranks[0]["weights"], ranks
