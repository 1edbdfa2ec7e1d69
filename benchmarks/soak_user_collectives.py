"""Soak test of the script's own collectives: N runs in a row per policy of tests/workers/user_collectives.py
(named + unnamed collectives every 10 steps, rank 1 10x slower, another process busy on a core), alternating
launchers. From the repository root: python benchmarks/soak_user_collectives.py [N] [policies]."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, "tests")
from launch import launch  # noqa: E402  (tests/launch.py: the launchers as the test suite runs them)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
policies = sys.argv[2].split(",") if len(sys.argv) > 2 else ["asp", "ssp", "dssp", "wbsp", "lbbsp", "zipline"]
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
try:
    for pol in policies:
        ok, times, fails = 0, [], []
        for i in range(N):
            launcher = ("mpirun", "horovodrun")[i % 2]
            env = {"HVD_ELASTIC_EMULATE_DELAY": "*:0.002,1:0.02", "HVD_ELASTIC_STALL_TIMEOUT": "30"}
            with tempfile.TemporaryDirectory() as d:
                args = [d, "--policies", pol, "--steps", "30", "--every", "10"]
                res = launch(launcher, 2, "tests/workers/user_collectives.py", args, env=env, timeout=150)
                good = res.returncode == 0 and not res.timed_out and all(
                    os.path.exists(os.path.join(d, f"rank{r}.{pol}.json")) for r in range(2))
                if good:
                    ranks = [json.load(open(os.path.join(d, f"rank{r}.{pol}.json"))) for r in range(2)]
                    good = ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"] and \
                        all(r["checked"] == 3 * 2 * 7 for r in ranks)
            ok += good
            times.append(res.elapsed)
            if not good:
                fails.append((i, launcher, res.timed_out, res.output[-800:]))
        print(f"{pol}: {ok}/{N} ran to the end (identical replicas, every check), "
              f"job {min(times):.1f}-{max(times):.1f} s", flush=True)
        for f in fails:
            print("  FAIL", f, flush=True)
finally:
    hog.kill()
