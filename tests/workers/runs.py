"""--runs of the training workers: several runs, one after the other in one process (one launch, one start-up),
each an optimizer built with its own keywords; and the per-rank output files the tests read."""
import json
import os


def each_run(spec: str, budget_key: str, default: int):
    """`spec`: a JSON list of the optimizer's keywords (each with "policy"); `budget_key` ("steps" or "target"), where
    a run has it, overrides `default`. Yields (policy, budget, keywords) in order."""
    for knobs in json.loads(spec):
        knobs = dict(knobs)
        budget = knobs.pop(budget_key, default)
        yield knobs["policy"], budget, knobs


def write_outputs(out_dir: str, rank: int, outs: dict):
    """Write each output (a JSON-able dict, given its file name: rank<r>.json, rank<r>.<policy>.json) with its
    rank."""
    for name, out in outs.items():
        out["rank"] = rank
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(out, f)
