"""Every knob with its full description: ``python -m hvd_elastic.knobs``.

``python -m hvd_elastic.knobs --readme [PATH]`` rewrites the knobs table of README.md (the checkout's by default)
from :data:`hvd_elastic.config.KNOBS`; tests/test_readme_tables.py fails while the two differ.
"""
from __future__ import annotations

import argparse
import re
import os
import textwrap

from .config import KNOBS, Knob

# ---- the README's knobs table, generated from KNOBS -----------------------------------------------------------------
README_BEGIN = "<!-- knobs:begin (generated from KNOBS: python -m hvd_elastic.knobs --readme) -->"
README_END = "<!-- knobs:end -->"


def _markdown(text: str) -> str:
    """`text` as a table cell: a | separates cells and a * may start emphasis, so both are escaped."""
    return re.sub(r"\s*\|\s*", r" \\| ", text).replace("*", r"\*")


def shown_default(knob: Knob) -> str:
    """The default as the variable would be written: 0|1 for a switch, (unset) for an empty value."""
    if isinstance(knob.default, bool):
        return str(int(knob.default))
    return "(unset)" if knob.default in ({}, "") else str(knob.default)


def knob_table() -> str:
    """The README's knobs table (markdown): one row per Knob, its summary as what it does."""
    rows = ["| variable | default | accepted | read by | what it does |", "|---|---|---|---|---|"]
    for k in KNOBS:
        read_by = ", ".join(k.used_by) or "every policy"
        rows.append(f"| `{k.variable}` | `{shown_default(k)}` | {_markdown(k.accepted)} | {read_by} "
                    f"| {_markdown(k.summary)} |")
    return "\n".join(rows) + "\n"


def with_knob_table(readme: str) -> str:
    """`readme` with the text between README_BEGIN and README_END replaced by :func:`knob_table`."""
    head, begin, rest = readme.partition(README_BEGIN)
    _, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise ValueError(f"no knobs table marked {README_BEGIN} ... {README_END}")
    return head + begin + "\n" + knob_table() + end + tail


README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def describe_knobs() -> str:
    out = []
    for k in KNOBS:
        out.append(f"{k.variable} (default {shown_default(k)}; accepted: {k.accepted}; "
                   f"read by {', '.join(k.used_by) or 'every policy'})")
        out += textwrap.wrap(" ".join(filter(None, (k.summary, k.doc))), 110, initial_indent="    ",
                             subsequent_indent="    ")
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hvd_elastic.knobs",
        description="Print every knob (HVD_ELASTIC_* variable) with its full description, or rewrite README.md's "
                    "knobs table from hvd_elastic.config.KNOBS.")
    parser.add_argument("--readme", nargs="?", const=README, metavar="PATH",
                        help="rewrite the knobs table of this README (default: the checkout's README.md)")
    args = parser.parse_args(argv)
    if args.readme is None:
        print(describe_knobs())
        return
    with open(args.readme) as f:
        text = f.read()
    new = with_knob_table(text)
    if new != text:
        with open(args.readme, "w") as f:
            f.write(new)
    print(f"{args.readme}: knobs table {'rewritten' if new != text else 'already up to date'}")


if __name__ == "__main__":
    main()
