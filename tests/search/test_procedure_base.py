"""The base-class helpers every procedure inherits: metric_value and the rng in the state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Decision, EpochReport, SearchProcedure, TrialSpec


class Minimal(SearchProcedure):
    def suggest(self) -> list[TrialSpec]:
        return [self._new_trial({"x": float(self.rng.random())})]

    def on_epoch_end(self, report: EpochReport) -> Decision:
        self.metric_value(report)
        return Decision.STOP

    def is_finished(self) -> bool:
        return False


def test_metric_value_reads_the_metric() -> None:
    proc = Minimal("loss", "min", np.random.default_rng(0))
    assert proc.metric_value(EpochReport("t0000", 1, {"loss": 2, "acc": 0.5})) == 2.0
    assert proc.score({"loss": 2.0}) == -2.0


def test_metric_value_names_trial_and_reported_metrics() -> None:
    proc = Minimal("accuracy", "max", np.random.default_rng(0))
    with pytest.raises(ConfigError) as err:
        proc.metric_value(EpochReport("t0003", 2, {"loss": 1.0, "acc": 0.5}))
    assert str(err.value) == (
        "metric 'accuracy' is missing from the report of trial t0003 (epoch 2); "
        "it reported: acc, loss"
    )
    with pytest.raises(ConfigError, match="it reported: none"):
        proc.metric_value(EpochReport("t0003", 2, {}))


@pytest.mark.parametrize(
    "bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64]
)
def test_state_dict_carries_the_rng(bit_generator: type[np.random.BitGenerator]) -> None:
    proc = Minimal("m", "max", np.random.Generator(bit_generator(7)))
    proc.suggest()
    state = json.loads(json.dumps(proc.state_dict()))
    assert state["next_trial_number"] == 1
    restored = Minimal("m", "max", np.random.Generator(bit_generator(12345)))
    restored.load_state_dict(state)
    assert restored.suggest() == proc.suggest()
    assert restored.state_dict() == proc.state_dict()


def test_state_without_rng_keeps_the_generator() -> None:
    proc = Minimal("m", "max", np.random.default_rng(3))
    proc.load_state_dict({"next_trial_number": 4})
    assert proc.suggest() == [TrialSpec("t0004", {"x": float(np.random.default_rng(3).random())})]
