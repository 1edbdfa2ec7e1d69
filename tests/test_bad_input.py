"""Invariant 8 (start-up part): bad settings stop every rank with one clear line, non-zero exit, no hang."""
import pytest

from launch import LAUNCHERS, launch

BOUND_S = 90  # generous: start-up of 2 ranks takes a few seconds; a hang would hit the 120 s kill


def _assert_every_rank_failed_with(res, np_, *needles):
    assert not res.timed_out, "the job hung:\n" + res.output[-3000:]
    assert res.elapsed < BOUND_S, res.elapsed
    assert res.returncode != 0, res.output[-3000:]
    errors = res.lines_with("hvd_elastic: error:")
    for needle in needles:
        errors = [ln for ln in errors if needle in ln]
    assert len(errors) >= np_, f"expected the error on each of {np_} ranks, got:\n" + res.output[-3000:]
    # No traceback wall from the ranks (the launcher itself may print its own when it stops the job).
    assert not [ln for ln in res.rank_lines() if "Traceback" in ln], res.output[-3000:]


CASES = {
    "unknown_policy": ({"HVD_ELASTIC_POLICY": "fastest"},
                       ["HVD_ELASTIC_POLICY='fastest' is not valid", "bsp|asp|ssp|dssp|zipline|lbbsp|wbsp"]),
    "malformed_knob": ({"HVD_ELASTIC_STALENESS": "three"},
                       ["HVD_ELASTIC_STALENESS='three' is not valid", "integer >= 0"]),
    "out_of_range_knob": ({"HVD_ELASTIC_LOOKAHEAD": "0"}, ["HVD_ELASTIC_LOOKAHEAD='0'", "integer >= 1"]),
    "dssp_range_inverted": ({"HVD_ELASTIC_DSSP_LOWER": "5", "HVD_ELASTIC_DSSP_UPPER": "2"},
                            ["HVD_ELASTIC_DSSP_UPPER=2 is below HVD_ELASTIC_DSSP_LOWER=5"]),
    "misspelt_variable": ({"HVD_ELASTIC_STALNESS": "2"}, ["unknown setting HVD_ELASTIC_STALNESS",
                                                           "HVD_ELASTIC_STALENESS"]),
    "emulation_names_missing_rank": ({"HVD_ELASTIC_EMULATE_DELAY": "7:0.1"},
                                     ["HVD_ELASTIC_EMULATE_DELAY names rank 7 but the job has 2 ranks"]),
    "stall_timeout_not_a_number": ({"HVD_ELASTIC_STALL_TIMEOUT": "abc"},
                                   ["HVD_ELASTIC_STALL_TIMEOUT='abc' is not valid", "number > 0 (seconds)"]),
    "stall_timeout_zero": ({"HVD_ELASTIC_STALL_TIMEOUT": "0"},
                           ["HVD_ELASTIC_STALL_TIMEOUT='0' is not valid", "number > 0 (seconds)"]),
    "bad_kwarg_value": ({"TEST_KWARG_POLICY": "nope"}, ["keyword argument policy='nope' is not valid"]),
}


# Both launchers are exercised; horovodrun costs ~5 s more per launch, so it takes every other case.
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_setting_stops_every_rank_with_one_line(case):
    env, needles = CASES[case]
    launcher = LAUNCHERS[sorted(CASES).index(case) % 2]
    res = launch(launcher, 2, "tests/workers/config_check.py", env=env, timeout=120)
    _assert_every_rank_failed_with(res, 2, *needles)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ranks_that_disagree_on_the_policy_are_named(launcher):
    res = launch(launcher, 2, "tests/workers/config_check.py",
                 env={"HVD_ELASTIC_POLICY": "bsp", "TEST_RANK_ENV": "1:HVD_ELASTIC_POLICY=ssp"}, timeout=120)
    _assert_every_rank_failed_with(res, 2, "HVD_ELASTIC_POLICY differs across ranks", "ranks 0: 'bsp'",
                                   "ranks 1: 'ssp'")


def test_good_settings_and_keyword_override_run():
    res = launch("mpirun", 2, "tests/workers/config_check.py",
                 env={"HVD_ELASTIC_POLICY": "fastest", "TEST_KWARG_POLICY": "bsp"}, timeout=120)
    assert res.returncode == 0, res.output[-3000:]
    # counted in the whole output: mpirun --tag-output once joined both ranks' lines into one (tenth session's CI)
    assert res.output.count("config ok on rank") == 2, res.output[-3000:]
    assert res.output.count("config ok on rank 0: policy=bsp") == 1
