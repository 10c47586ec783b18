"""The report's header says how many workers the run had, not only what the config asked.

A search on 2 partitions with ``workers: 4`` (the Tuner's default on ``local[4]``), or an
elastic plan of fewer, runs on fewer workers than ``workers``: the header read "4 workers"
for a 2-worker run (issue 30). No torch, no Spark.
"""

from __future__ import annotations

from typing import Any

from cerebro_spark.driver._config import ElasticConfig
from cerebro_spark.report import collect
from cerebro_spark.report._html import render
from tests.report.test_report_units import CONFIG as TWO_EPOCHS

CONFIG = TWO_EPOCHS.replace(workers=4)


def start(time: float, resumed: bool = False) -> dict[str, Any]:
    return {"event": "experiment_start", "time": time, "config": {}, "resumed": resumed}


def member(kind: str, time: float, worker: str) -> dict[str, Any]:
    return {"event": f"worker_{kind}", "time": time, "worker": worker, "host": "h"}


def header(config: Any, events: list[dict[str, Any]]) -> str:
    page = render(collect("x", config, events))
    return page.split('<p class="meta">', 1)[1].split("</p>", 1)[0]


def test_the_header_counts_the_workers_present_at_once() -> None:
    events = [start(100.0), member("joined", 101.0, "w0"), member("joined", 101.5, "w1")]
    assert collect("x", CONFIG, events).peak_workers == 2
    assert "2 epochs, 2 workers (4 configured)" in header(CONFIG, events)
    same = CONFIG.replace(workers=2)
    assert "2 epochs, 2 workers &middot;" in header(same, events)
    # One lost and another joined: still 2 at once; a resumed session starts from none.
    events += [
        member("lost", 102.0, "w1"),
        member("joined", 103.0, "w2"),
        start(200.0, resumed=True),
        member("joined", 201.0, "w3"),
    ]
    assert collect("x", CONFIG, events).peak_workers == 2


def test_before_any_worker_and_on_an_elastic_run() -> None:
    assert "2 epochs, 4 workers configured" in header(CONFIG, [start(100.0)])
    elastic = CONFIG.replace(
        deadline=600.0, elastic=ElasticConfig("standalone", "conf/prices/local.yaml")
    )
    events = [start(100.0)] + [member("joined", 101.0, f"w{i}") for i in range(3)]
    events += [member("retired", 110.0, "w2"), member("joined", 111.0, "w3")]
    assert "2 epochs, up to 3 workers (elastic)" in header(elastic, events)
