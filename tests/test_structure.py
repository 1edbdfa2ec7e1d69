"""The structure targets, kept: no module of the package over 400 lines, no class over 250, no function over 50
(docstrings excluded; ci/sizes.py measures them), no module reading another object's private fields, and no policy
named outside the registry."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_module_class_or_function_over_the_size_limits():
    res = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "sizes.py")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


# Private names of libraries the package uses where they have no public twin: torch's foreach kernels and a
# tensor's version counter (backward_push.py), os._exit (exit without Horovod's shutdown), sys._getframe, and the
# state handlers of Horovod's TorchState (torch/elastic.py: its sync, less what a survivor's replica replaces).
LIBRARY_PRIVATES = {"torch._foreach_add", "torch._foreach_add_", "torch._foreach_copy_", "torch._foreach_div_",
                    "os._exit", "sys._getframe"}
LIBRARY_PRIVATE_ATTRIBUTES = {"_version", "_handlers"}


def _private_reads(path):
    """(line, text) of every read of another object's private attribute (``x._name``, x not self or cls) in `path`;
    strings, comments, import lines and assignments (Horovod's own attributes set on an optimizer) left out."""
    import io
    import tokenize
    lines = {}
    with open(path) as f:
        for tok in tokenize.generate_tokens(io.StringIO(f.read()).readline):
            if tok.type not in (tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
                lines.setdefault(tok.start[0], []).append(tok.string)
    out = []
    for number, toks in lines.items():
        if toks[0] in ("from", "import"):
            continue
        text = "".join(t if t in ".()[]," else f" {t} " for t in toks).replace(" .", ".").replace(". ", ".")
        for m in re.finditer(r"([A-Za-z_][\w.]*)\.(_[A-Za-z]\w*)\b(\s*=(?!=))?", text):
            base, attr, write = m.group(1), m.group(2), m.group(3)
            if base in ("self", "cls") or write or attr.startswith("__") or f"{base}.{attr}" in LIBRARY_PRIVATES \
                    or attr in LIBRARY_PRIVATE_ATTRIBUTES:
                continue
            out.append((number, f"{base}.{attr}"))
    return out


def test_no_module_of_the_package_reads_another_objects_private_fields():
    """The engine and ticker keep their state to themselves, and a frontend's per-optimizer state is one object
    read through one accessor (torch/attached.py, tensorflow/_core.py state_of), never `opt._hvd_elastic_*`."""
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "hvd_elastic")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                offenders += [f"{os.path.relpath(path, ROOT)}:{n}: {t}" for n, t in _private_reads(path)]
    assert not offenders, offenders


def test_the_ticker_and_its_tick_loop_reach_each_other_through_methods_only():
    """engine/loop.py is built from its parts (TickParts) and never sees the Ticker; engine/ticker.py only calls the
    loop's methods, never reads its fields."""
    engine = os.path.join(ROOT, "hvd_elastic", "engine")
    loop = open(os.path.join(engine, "loop.py")).read()
    assert not re.findall(r"\bticker\.(?!py\b)\w+", loop), "engine/loop.py reads the Ticker"
    ticker = open(os.path.join(engine, "ticker.py")).read()
    uses = re.findall(r"self\._loop\.(\w+)(\(?)", ticker)
    assert uses and all(call for _, call in uses), [name for name, call in uses if not call]


def test_the_private_read_guard_sees_a_read_of_another_objects_field(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(opt, engine):\n    x = opt._hvd_elastic_flat\n    engine._backlog.clear()\n"
                     "    self._ok = 1\n    opt._parameter_names = {}\n")
    assert [t for _, t in _private_reads(str(probe))] == ["opt._hvd_elastic_flat", "engine._backlog"]


def _policy_name_literals(path):
    """(line, literal) of every string literal in `path` that is exactly a policy's name -- but a name that is also a
    value of another knob ("auto": HVD_ELASTIC_TICK_PACING, HVD_ELASTIC_MAX_INFLIGHT), which a literal cannot tell
    apart -- and (line, text) of every comparison of a `.policy` with anything."""
    import io
    import re
    import tokenize

    from hvd_elastic.config import KNOBS
    from hvd_elastic.registry import NAMES
    other_values = {v.strip() for k in KNOBS if k.name != "policy" for v in k.accepted.split("|")}
    names = set(NAMES) - other_values
    out = []
    with open(path) as f:
        text = f.read()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.string.strip("\"'") in names and tok.string[0] in "\"'":
            out.append((tok.start[0], tok.string))
    for n, line in enumerate(text.splitlines(), 1):
        if re.search(r"\.policy\s*(==|!=|\bin\b|\bnot in\b)", line.split("#")[0]):
            out.append((n, line.strip()))
    return out


def test_the_policy_name_guard_sees_a_name_and_a_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('x = "lbbsp"\nif cfg.policy == other:\n    pass\ny = "auto"\n')
    assert [n for n, _ in _policy_name_literals(str(probe))] == [1, 2]


def test_no_module_but_the_registry_and_the_knob_parser_names_a_policy():
    """What a policy is lives in hvd_elastic/registry.py; everything else asks it (cfg.spec), never a policy's name."""
    offenders = []
    package = os.path.join(ROOT, "hvd_elastic")
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)
            if name.endswith(".py") and rel not in ("hvd_elastic/registry.py", "hvd_elastic/config.py"):
                offenders += [f"{rel}:{line}: {lit}" for line, lit in _policy_name_literals(path)]
    assert not offenders, offenders


def test_every_knob_is_read_by_some_policy_and_every_declared_knob_exists():
    from hvd_elastic import registry
    from hvd_elastic.config import KNOBS_BY_NAME
    declared = set(registry.COMMON_KNOBS) | {k for p in registry.REGISTRY.values() for k in p.knobs}
    assert declared == set(KNOBS_BY_NAME), declared ^ set(KNOBS_BY_NAME)
    for p in registry.REGISTRY.values():
        assert p.lockstep or p.rule, p.name                 # a tick policy names its rule class
        assert set(p.refuses) <= set(registry.HOROVOD_ARGUMENTS), p.name
        for knob, switch in p.knobs_when:   # a conditional knob is one of its own, switched by a boolean knob it reads
            assert knob in p.knobs and switch in p.knobs and isinstance(KNOBS_BY_NAME[switch].default, bool), p.name
        assert set(p.frontends) <= set(registry.FRONTENDS), p.name
