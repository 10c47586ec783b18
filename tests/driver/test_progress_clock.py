"""Progress reads the driver's clock: elapsed is experiment time, seconds since ``run``."""

from __future__ import annotations

from cerebro_spark.driver._progress import Progress


def test_elapsed_counts_from_the_origin_given() -> None:
    now = [42.0]  # the experiment clock after 42 s of start-up (or of earlier sessions)
    progress = Progress(clock=lambda: now[0], epochs=3, origin=0.0)
    progress.start_round(0, units_total=4)
    now[0] = 50.0
    snapshot = progress.snapshot()
    assert snapshot.elapsed == 50.0 and (snapshot.round, snapshot.epoch) == (1, 1)
    assert "elapsed 0:50" in snapshot.line()


def test_without_an_origin_elapsed_counts_from_construction() -> None:
    now = [42.0]
    progress = Progress(clock=lambda: now[0])
    now[0] = 50.0
    assert progress.snapshot().elapsed == 8.0
