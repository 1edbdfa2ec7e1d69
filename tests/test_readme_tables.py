"""README.md's tables against the code: the knobs table is generated from KNOBS, the policies table names POLICIES."""
import os
import re

from hvd_elastic.config import KNOBS_BY_NAME, POLICIES
from hvd_elastic.knobs import README_BEGIN, README_END, knob_table, with_knob_table

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def readme() -> str:
    with open(README) as f:
        return f.read()


def test_readme_knob_table_is_the_generated_one():
    text = readme()
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1
    assert with_knob_table(text) == text, \
        "README.md's knobs table differs from KNOBS: run `python -m hvd_elastic.knobs --readme`"


def test_a_changed_row_is_caught():
    text = readme()
    row = next(line for line in knob_table().splitlines() if "`HVD_ELASTIC_PEER_WAIT`" in line)
    edited = text.replace(row, row.replace("`0.5`", "`0.25`"))
    assert edited != text and with_knob_table(edited) == text


def policy_rows(text: str) -> dict:
    """{policy: first cell} of the rows of the table under '## Policies' (its header and separator skipped)."""
    section = text.split("\n## Policies\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    cells = [row.split("|")[1].strip() for row in rows]
    return {re.match(r"`([^`]+)`", cell).group(1): cell for cell in cells}


def test_readme_policy_table_names_every_policy_and_only_those():
    rows = policy_rows(readme())
    assert sorted(rows) == sorted(POLICIES), "README.md's policies table and config.POLICIES differ"
    default = KNOBS_BY_NAME["policy"].default
    assert [p for p, cell in rows.items() if "(default)" in cell] == [default]
