"""The README's PyTorch and Keras snippets, run as written (2 ranks, the policy from HVD_ELASTIC_POLICY): they
train and end with identical weights on every rank. A prelude defines only what a snippet leaves to the reader
(the model, the data, the loss, the step budget): tests/workers/readme_snippet.py."""
import json

import pytest

from launch import launch


@pytest.mark.parametrize("kind,policy,launcher", [("torch", "asp", "mpirun"), ("keras", "bsp", "horovodrun")])
def test_readme_snippet_runs_as_written(kind, policy, launcher, tmp_path):
    res = launch(launcher, 2, "tests/workers/readme_snippet.py", [kind, tmp_path],
                 env={"HVD_ELASTIC_POLICY": policy}, timeout=180)
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    out = json.load(open(tmp_path / "snippet.json"))
    assert out == {"identical": True, "ranks": 2}, out
