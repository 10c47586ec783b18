"""Make ``tests.backends.*`` importable, here and in the worker processes tests start.

Workers load test specs by import path (``tests.backends.failing_spec:GatedSpec``). The
repository root goes on ``sys.path`` (spawned ``multiprocessing`` children inherit it) and
on ``PYTHONPATH`` for the session (for workers that are not ``multiprocessing`` children,
such as Spark's Python workers).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session", autouse=True)
def _root_on_pythonpath() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        current = os.environ.get("PYTHONPATH")
        parts = current.split(os.pathsep) if current else []
        if ROOT not in parts:
            patch.setenv("PYTHONPATH", os.pathsep.join([ROOT, *parts]))
        yield
