"""The collector during a run (what predates it is frozen) and while a log is read (paused)."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any

import pytest

from cerebro_spark.driver._heap import frozen_heap, paused_collector
from cerebro_spark.engine import EventLog, ExperimentState, read_events
from cerebro_spark.store import open_store


@pytest.fixture(autouse=True)
def thawed():
    """Every test starts and ends with nothing frozen and the collector on."""
    gc.unfreeze()
    enabled = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_what_exists_at_the_start_is_frozen_for_the_block_then_thawed() -> None:
    kept = [[i] for i in range(10)]  # lists: objects the collector tracks

    def walked(value: object) -> bool:  # in a generation the collector walks
        return any(o is value for o in gc.get_objects())

    assert walked(kept[0])
    with frozen_heap() as frozen:
        assert frozen and gc.get_freeze_count() >= len(kept)
        made = [[1]]
        assert not walked(kept[0]) and walked(made[0])  # the block's own objects are
    assert gc.get_freeze_count() == 0
    assert walked(kept[0])


def test_it_thaws_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_is_left_alone() -> None:
    kept = [[i] for i in range(10)]
    gc.freeze()
    with frozen_heap() as frozen:
        assert not frozen
    # its owner thaws them, not the run (the count itself drops as frozen objects die)
    assert gc.get_freeze_count() > 0
    assert not any(o is kept[0] for o in gc.get_objects())


def test_a_disabled_collector_is_left_alone() -> None:
    gc.disable()
    with frozen_heap() as frozen:
        assert not frozen and gc.get_freeze_count() == 0
    assert not gc.isenabled()


def test_the_collector_is_paused_for_the_block_and_back_on_after_it() -> None:
    with paused_collector():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), paused_collector():
        raise KeyError("a malformed event")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with paused_collector():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_reading_and_folding_a_log_pause_the_collector_only_meanwhile(tmp_path) -> None:
    store = open_store(str(tmp_path))
    log = EventLog(store)
    seen: list[bool] = []

    class Probe(ExperimentState):
        def _on_probe(self, event: Mapping[str, Any]) -> None:
            seen.append(gc.isenabled())

    log.append("probe")
    log.flush()
    Probe.from_events(read_events(store))
    assert seen == [False] and gc.isenabled()
