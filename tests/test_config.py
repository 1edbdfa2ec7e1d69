"""Configuration parsing and validation (single process: this is pure parsing, no distributed behaviour)."""
import dataclasses

import pytest

from hvd_elastic.config import (KNOBS, POLICIES, SUMMARY_MAX, Config, check_ranks_agree, parse_settings,
                                raw_settings, unused_settings)
from hvd_elastic.errors import ConfigError


def test_defaults_are_bsp_and_the_papers_values():
    cfg = Config.from_env({})
    assert cfg.policy == "bsp"
    assert (cfg.staleness, cfg.dssp_lower, cfg.dssp_upper, cfg.lookahead) == (3, 3, 15, 15)
    assert cfg.report is True and cfg.emulate_delay == {}


def test_every_policy_name_parses_case_insensitively():
    for p in POLICIES:
        assert Config.from_env({"HVD_ELASTIC_POLICY": p.upper()}).policy == p


def test_keyword_argument_wins_over_environment():
    cfg = Config.from_env({"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "5"}, staleness=0)
    assert (cfg.policy, cfg.staleness) == ("ssp", 0)


@pytest.mark.parametrize("var,value", [("POLICY", "fastest"), ("STALENESS", "-1"), ("STALENESS", "1.5"),
                                       ("LOOKAHEAD", "0"), ("TICK_MS", "nan"), ("TICK_MS", "0"),
                                       ("WBSP_OVERLAP", "maybe"), ("EMULATE_DELAY", "3=0.1"),
                                       ("EMULATE_DELAY", "3:-1"), ("EMULATE_SLOWDOWN", "1:0.5"),
                                       ("PREDICTOR", "oracle"), ("LBBSP_MODE", "tpu")])
def test_bad_value_is_one_line_naming_variable_value_and_accepted(var, value):
    with pytest.raises(ConfigError) as e:
        Config.from_env({"HVD_ELASTIC_" + var: value})
    msg = str(e.value)
    assert "\n" not in msg
    assert f"HVD_ELASTIC_{var}={value!r} is not valid; accepted: " in msg


def test_unknown_variable_is_rejected_not_ignored():
    with pytest.raises(ConfigError, match="unknown setting HVD_ELASTIC_STALNESS; accepted: .*HVD_ELASTIC_STALENESS"):
        Config.from_env({"HVD_ELASTIC_STALNESS": "2"})
    with pytest.raises(ConfigError, match="unknown setting keyword argument stalness"):
        Config.from_env({}, stalness=2)


def test_tooling_variables_are_not_run_settings():
    assert Config.from_env({"HVD_ELASTIC_CACHE": "/tmp/x", "HVD_ELASTIC_VENV": "/tmp/v"}).policy == "bsp"


def test_dssp_upper_below_lower_is_rejected():
    with pytest.raises(ConfigError, match="HVD_ELASTIC_DSSP_UPPER=2 is below HVD_ELASTIC_DSSP_LOWER=4"):
        Config.from_env({"HVD_ELASTIC_DSSP_LOWER": "4", "HVD_ELASTIC_DSSP_UPPER": "2"})


def test_per_rank_emulation_spec():
    cfg = Config.from_env({"HVD_ELASTIC_EMULATE_DELAY": "*:0.01, 3:0.05", "HVD_ELASTIC_EMULATE_SLOWDOWN": "2:3"})
    assert [cfg.per_rank("emulate_delay", r, 4) for r in range(4)] == [0.01, 0.01, 0.01, 0.05]
    assert [cfg.per_rank("emulate_slowdown", r, 4) for r in range(4)] == [1.0, 1.0, 3.0, 1.0]
    with pytest.raises(ConfigError, match="names rank 3 but the job has 2 ranks"):
        cfg.per_rank("emulate_delay", 0, 2)


def test_knobs_the_policy_does_not_read_are_reported():
    raw = raw_settings({"HVD_ELASTIC_POLICY": "bsp", "HVD_ELASTIC_STALENESS": "2", "HVD_ELASTIC_TICK_MS": "3"})
    assert unused_settings(raw, parse_settings(raw)) == ["HVD_ELASTIC_STALENESS", "HVD_ELASTIC_TICK_MS"]
    raw = raw_settings({"HVD_ELASTIC_POLICY": "ssp", "HVD_ELASTIC_STALENESS": "2"})
    assert unused_settings(raw, parse_settings(raw)) == []
    # wbsp reads HVD_ELASTIC_RELAX_MIN_GAIN only with its lock-step fallback on
    raw = raw_settings({"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_RELAX_MIN_GAIN": "2"})
    assert unused_settings(raw, parse_settings(raw)) == ["HVD_ELASTIC_RELAX_MIN_GAIN"]
    raw = raw_settings({"HVD_ELASTIC_POLICY": "wbsp", "HVD_ELASTIC_RELAX_MIN_GAIN": "2", "HVD_ELASTIC_WBSP_LOCKSTEP": "1"})
    assert unused_settings(raw, parse_settings(raw)) == []


def test_auto_runs_wbsp_with_overlap_and_the_lockstep_fallback_whatever_the_settings_say():
    cfg = parse_settings(raw_settings({"HVD_ELASTIC_POLICY": "auto"}))
    assert (cfg.wbsp_overlap, cfg.wbsp_lockstep, cfg.spec.deltas, cfg.spec.rule) == \
        (True, True, True, parse_settings(raw_settings({"HVD_ELASTIC_POLICY": "wbsp"})).spec.rule)
    # its presets are not its knobs: setting one is reported as not read, and changes nothing
    raw = raw_settings({"HVD_ELASTIC_POLICY": "auto", "HVD_ELASTIC_WBSP_OVERLAP": "0", "HVD_ELASTIC_RELAX_MIN_GAIN": "2"})
    cfg = parse_settings(raw)
    assert unused_settings(raw, cfg) == ["HVD_ELASTIC_WBSP_OVERLAP"]
    assert (cfg.wbsp_overlap, cfg.wbsp_lockstep, cfg.relax_min_gain) == (True, True, 2.0)


def test_rank_disagreement_names_the_ranks():
    raws = [raw_settings({"HVD_ELASTIC_POLICY": p}) for p in ("bsp", "bsp", "ssp")]
    gathered = [{k: v[1] for k, v in r.items()} for r in raws]
    check_ranks_agree(raws[0], lambda mine: [gathered[0]] * 3)   # all equal: no error
    with pytest.raises(ConfigError,
                       match=r"HVD_ELASTIC_POLICY differs across ranks \(ranks 0,1: 'bsp'; ranks 2: 'ssp'\)"):
        check_ranks_agree(raws[0], lambda mine: gathered)


def test_config_fields_and_defaults_are_the_knobs():
    fields = dataclasses.fields(Config)
    assert [f.name for f in fields] == [k.name for k in KNOBS]
    for f, k in zip(fields, KNOBS):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert default == k.default and type(default) is type(k.default), k.name
    assert Config() == Config.from_env({})
    assert Config().lbbsp_caps is not Config().lbbsp_caps   # a mutable default is not shared between Configs
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().policy = "asp"
    assert dataclasses.replace(Config(), staleness=5).staleness == 5
    assert set(Config().describe()) == {k.name for k in KNOBS}


def test_every_knob_has_one_short_summary_line():
    for k in KNOBS:
        assert k.summary and "\n" not in k.summary and len(k.summary) <= SUMMARY_MAX, k.name
        assert set(k.used_by) <= set(POLICIES), k.name
