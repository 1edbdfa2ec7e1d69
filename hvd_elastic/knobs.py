"""Every knob with its full description: ``python -m hvd_elastic.knobs``.

``python -m hvd_elastic.knobs --readme [PATH]`` rewrites the knobs table of README.md (the checkout's by default)
from :data:`hvd_elastic.config.KNOBS`; tests/test_readme_tables.py fails while the two differ.
"""
from __future__ import annotations

import argparse
import os
import textwrap

from .config import KNOBS, shown_default, with_knob_table

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
