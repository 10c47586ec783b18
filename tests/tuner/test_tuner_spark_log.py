"""Tuner.fit leaves Spark's console level as it found it, whether it returned or raised.

Read through the JVM: log4j2's root logger level and Spark's console threshold of a
PySpark-started session (``Logging.sparkShellThresholdLevel``), which a fresh session
sets to WARN while its root stays at INFO (issue 30, part 5).
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
import pytest
from sklearn.datasets import load_iris

from cerebro_spark.errors import CerebroError
from cerebro_spark.tuner import Tuner
from cerebro_spark.tuner._spark_log import SparkLogLevels, restore_spark_log_levels

pytestmark = pytest.mark.spark

SPACE = {"model": "cerebro_spark.training:MLPSpec", "hidden_units": [8], "batch_size": 16}


def jvm_levels(spark: Any) -> tuple[str, str | None]:
    """The root logger's level and the console threshold, read from the JVM."""
    jvm = spark.sparkContext._jvm
    root = str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
    logging_object = getattr(getattr(jvm.org.apache.spark.internal, "Logging$"), "MODULE$")
    threshold = logging_object.sparkShellThresholdLevel()
    return root, None if threshold is None else str(threshold)


@pytest.fixture
def fresh_levels(spark: Any) -> Any:
    """Spark's levels as a fresh PySpark session has them: root INFO, console WARN."""
    before = jvm_levels(spark)
    restore_spark_log_levels(spark, SparkLogLevels("INFO", "WARN"))
    assert jvm_levels(spark) == ("INFO", "WARN")
    yield spark
    restore_spark_log_levels(spark, SparkLogLevels(*before))


def iris_frame() -> pd.DataFrame:
    data = load_iris()
    frame = pd.DataFrame(data.data, columns=[f"x{i}" for i in range(4)])
    frame["label"] = data.target
    return frame


def tuner(tmp_path: Any, level: str | None = "ERROR") -> Tuner:
    return Tuner(
        SPACE,
        epochs=1,
        workers=1,
        backend="local",
        store=str(tmp_path),
        progress=False,
        spark_log_level=level,
    )


def test_a_fit_that_raised_restores_root_level_and_console_threshold(
    fresh_levels: Any, tmp_path: Any
) -> None:
    with pytest.raises(CerebroError, match="no_such_label"):
        tuner(tmp_path).fit(iris_frame(), label="no_such_label")  # raised while preparing
    assert jvm_levels(fresh_levels) == ("INFO", "WARN")


@pytest.mark.torch
def test_a_fit_that_returned_restores_both_and_ran_at_the_tuners_level(
    fresh_levels: Any, tmp_path: Any
) -> None:
    seen: list[tuple[str, str | None]] = []

    class Watching(logging.Handler):  # the pre-flight's summary line: fit is under way
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("pre-flight:"):
                seen.append(jvm_levels(fresh_levels))

    watched = logging.getLogger("cerebro_spark.driver._preflight")
    handler, level = Watching(), watched.level
    watched.addHandler(handler)
    watched.setLevel(logging.INFO)
    try:
        result = tuner(tmp_path).fit(iris_frame(), experiment_id="levels")
    finally:
        watched.removeHandler(handler)
        watched.setLevel(level)
    assert result.best is not None  # a real search ran
    assert seen == [("ERROR", None)]  # the tuner's level during fit
    assert jvm_levels(fresh_levels) == ("INFO", "WARN")


def test_a_tuner_without_a_level_leaves_spark_alone(fresh_levels: Any, tmp_path: Any) -> None:
    with pytest.raises(CerebroError, match="no_such_label"):
        tuner(tmp_path, level=None).fit(iris_frame(), label="no_such_label")
    assert jvm_levels(fresh_levels) == ("INFO", "WARN")
