"""The README's Reliability section is the catalogue: every case it names exists.

A case is named as a test file (``test_x.py``, in ``tests/reliability/`` unless a path is
given) or a path under ``tests/`` or ``benchmarks/``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def reliability_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Reliability\n")
    return text[start : text.index("\n## ", start + 1)]


def named_cases(section: str) -> list[Path]:
    """Every file the section names in backquotes, as a path from the repository root."""
    cases = []
    for name in re.findall(r"`([\w./]+\.py)", section):
        path = Path(name) if "/" in name else Path("tests/reliability") / name
        cases.append(path)
    return cases


def test_every_case_the_catalogue_names_exists() -> None:
    cases = named_cases(reliability_section())
    assert len(cases) >= 15, cases  # the section still names its cases
    missing = [str(case) for case in cases if not (ROOT / case).is_file()]
    assert not missing, f"the README's Reliability section names missing cases: {missing}"


def test_every_reliability_test_file_is_in_the_catalogue() -> None:
    named = {case.name for case in named_cases(reliability_section())}
    files = {p.name for p in (ROOT / "tests" / "reliability").glob("test_*.py")}
    unnamed = sorted(files - named - {"test_catalogue.py"})
    assert not unnamed, f"reliability cases the README's catalogue does not name: {unnamed}"
