"""Invariant 8 (docs/design.md, "Invariants"), start-up part: bad settings stop every rank with one clear line,
non-zero exit, no hang.

On real launches (tests/workers/config_check.py, both launchers): a bad value, ranks that disagree, and good settings
with a keyword override -- the path from the ranks' settings through their comparison to the one line each rank
prints. Every other bad setting goes down the same path with its own message, so its message is checked in one
process (Config.from_env raises the ConfigError whose text each rank prints; more in tests/test_config.py)."""
import pytest

from hvd_elastic.config import Config
from hvd_elastic.errors import ConfigError
from launch import launch


def _assert_every_rank_failed_with(res, np_, *needles):
    assert not res.timed_out, "the job hung:\n" + res.output[-3000:]
    assert res.returncode != 0, res.output[-3000:]
    errors = res.lines_with("hvd_elastic: error:")
    for needle in needles:
        errors = [ln for ln in errors if needle in ln]
    assert len(errors) >= np_, f"expected the error on each of {np_} ranks, got:\n" + res.output[-3000:]
    # No traceback wall from the ranks (the launcher itself may print its own when it stops the job).
    assert not [ln for ln in res.rank_lines() if "Traceback" in ln], res.output[-3000:]


def test_an_unknown_policy_stops_every_rank_with_one_line():
    res = launch("horovodrun", 2, "tests/workers/config_check.py", env={"HVD_ELASTIC_POLICY": "fastest"}, timeout=120)
    _assert_every_rank_failed_with(res, 2, "HVD_ELASTIC_POLICY='fastest' is not valid",
                                   "bsp|asp|ssp|dssp|zipline|lbbsp|wbsp|auto")


def test_ranks_that_disagree_on_the_policy_are_named():
    res = launch("mpirun", 2, "tests/workers/config_check.py",
                 env={"HVD_ELASTIC_POLICY": "bsp", "TEST_RANK_ENV": "1:HVD_ELASTIC_POLICY=ssp"}, timeout=120)
    _assert_every_rank_failed_with(res, 2, "HVD_ELASTIC_POLICY differs across ranks", "ranks 0: 'bsp'",
                                   "ranks 1: 'ssp'")


def test_good_settings_and_keyword_override_run():
    res = launch("mpirun", 2, "tests/workers/config_check.py",
                 env={"HVD_ELASTIC_POLICY": "fastest", "TEST_KWARG_POLICY": "bsp"}, timeout=120)
    assert res.returncode == 0, res.output[-3000:]
    # counted in the whole output: mpirun --tag-output may join both ranks' lines into one
    assert res.output.count("config ok on rank") == 2, res.output[-3000:]
    assert res.output.count("config ok on rank 0: policy=bsp") == 1


# (environment, keyword arguments, what the one line must say). A misspelt variable, an inverted dssp range and an
# emulation spec naming a missing rank: tests/test_config.py.
MESSAGES = {
    "malformed_knob": ({"HVD_ELASTIC_STALENESS": "three"}, {},
                       ["HVD_ELASTIC_STALENESS='three' is not valid", "integer >= 0"]),
    "out_of_range_knob": ({"HVD_ELASTIC_LOOKAHEAD": "0"}, {}, ["HVD_ELASTIC_LOOKAHEAD='0'", "integer >= 1"]),
    "stall_timeout_not_a_number": ({"HVD_ELASTIC_STALL_TIMEOUT": "abc"}, {},
                                   ["HVD_ELASTIC_STALL_TIMEOUT='abc' is not valid", "number > 0 (seconds)"]),
    "stall_timeout_zero": ({"HVD_ELASTIC_STALL_TIMEOUT": "0"}, {},
                           ["HVD_ELASTIC_STALL_TIMEOUT='0' is not valid", "number > 0 (seconds)"]),
    "bad_kwarg_value": ({}, {"policy": "nope"}, ["keyword argument policy='nope' is not valid"]),
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_a_bad_setting_is_one_line_naming_it_and_what_is_accepted(case):
    env, kwargs, needles = MESSAGES[case]
    with pytest.raises(ConfigError) as e:
        Config.from_env(env, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
