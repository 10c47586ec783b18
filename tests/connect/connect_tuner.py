"""The notebook path on Spark Connect (issue 28, part 5), in the Connect child process.

``Tuner.fit`` on a DataFrame of a Spark Connect session, the leaderboard,
``best_model().transform`` on held-out rows and ``load_model``; what the user would look
at is written to ``$CEREBRO_CONNECT_REPORT/notebook.json`` for the parent, which runs the
same notebook on a classic session and compares (``tests/connect/test_connect.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.connect.notebook import notebook

pytestmark = [pytest.mark.spark, pytest.mark.torch]


def test_the_notebook_path_runs_on_spark_connect(spark_connect: Any, tmp_path: Path) -> None:
    seen = notebook(spark_connect, tmp_path, "connect")
    assert seen["backend"] == "spark"
    assert seen["prediction"] == seen["local"] and len(seen["local"]) == 45
    np.testing.assert_allclose(seen["probability_sums"], 1.0, rtol=1e-6)
    report = os.environ.get("CEREBRO_CONNECT_REPORT")
    if report:
        Path(report, "notebook.json").write_text(json.dumps(seen, default=float))
