"""Group units in the report, from a real run: one trial trained data-parallel (gloo) by
both LocalBackend workers at once shows as one bar per rank, on each worker, together."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.engine import parse_config, run_experiment
from cerebro_spark.report import load_report_data
from cerebro_spark.report._figures import gantt
from cerebro_spark.search import GridSearch
from cerebro_spark.search._registry import PROCEDURES

pytestmark = [pytest.mark.torch, pytest.mark.slow]


class PairedGrid(GridSearch):
    """Grid search whose every trial trains on 2 workers per unit."""

    def resources(self, trial_id: str) -> int:
        return 2


@pytest.fixture(autouse=True)
def paired_procedure() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "paired-grid", PairedGrid)
        yield


def test_group_ranks_are_bars_on_each_worker_at_once(tmp_path: Path) -> None:
    config = parse_config(
        {
            "name": "paired",
            "seed": 2,
            "store": str(tmp_path),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": "paired-grid",
            "epochs": 1,
            "workers": 2,
            "backend": "local",
            "space": {
                "model": "cerebro_spark.training:MLPSpec",
                "hidden_units": [16],
                "batch_size": 64,
            },
        }
    )
    run_experiment(config, experiment_id="g")
    data = load_report_data(str(tmp_path), "g")
    ranks: dict[str, list[Any]] = defaultdict(list)
    for unit in data.units:
        if unit.kind == "group":
            ranks[str(unit.group)].append(unit)
    assert ranks and all(len(r) == 2 for r in ranks.values())  # 4 partitions, 2 per group
    for group, (first, second) in ranks.items():
        assert {first.worker, second.worker} == {"w0", "w1"}, group
        assert first.start < second.end and second.start < first.end  # ran together
    figure = gantt(data)
    assert "group" in {trace.name for trace in figure.data}
