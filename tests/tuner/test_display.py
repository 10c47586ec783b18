"""The progress bar: live on terminals and notebooks, plain lines in logs."""

import io
import logging

from cerebro_spark.driver._progress import Progress, ProgressSnapshot
from cerebro_spark.tuner import ProgressDisplay
from cerebro_spark.tuner._display import PROGRESS_LOGGER, render, showing_progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def snapshot(**fields):
    base = dict(
        round=2,
        epoch=2,
        epochs=8,
        units_done=5,
        units_total=10,
        best="accuracy 0.9 (t1)",
        elapsed=65.0,
        eta=30.0,
    )
    return ProgressSnapshot(**{**base, **fields})


def test_render_shows_units_epoch_best_and_eta():
    line = render(snapshot())
    assert line.startswith("epoch 2/8 [##########----------] 5/10 units")
    assert "best accuracy 0.9 (t1)" in line and "1:05" in line and "ETA 0:30" in line
    assert "ETA -" in render(snapshot(eta=None))


def test_progress_estimates_the_rounds_time_left_from_its_unit_rate():
    clock = Clock()
    progress = Progress(clock=clock, epochs=4)
    progress.start_round(0, units_total=8, units_done=2, epoch=0)
    assert progress.snapshot().eta is None
    clock.now = 10.0
    progress.unit_done()
    progress.unit_done()  # 2 units in 10 s, 4 left
    shot = progress.snapshot()
    assert (shot.units_done, shot.eta, shot.round, shot.epoch) == (4, 20.0, 1, 1)


def test_live_display_redraws_one_line_and_plain_display_writes_few_lines():
    stream = io.StringIO()
    live = ProgressDisplay(stream, live=True)
    with showing_progress(live):
        for done in (1, 2):
            logging.getLogger(PROGRESS_LOGGER).info(
                "x", extra={"progress": snapshot(units_done=done)}
            )
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1

    clock = Clock()
    stream = io.StringIO()
    plain = ProgressDisplay(stream, live=False, plain_interval=30, clock=clock)
    with showing_progress(plain):
        for now in (0.0, 10.0, 31.0):
            clock.now = now
            logging.getLogger(PROGRESS_LOGGER).info("x", extra={"progress": snapshot()})
        clock.now = 35.0  # too soon for a line of its own, but the last before the end
        logging.getLogger(PROGRESS_LOGGER).info("x", extra={"progress": snapshot(units_done=9)})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()
    assert " 9/10 units" in lines[-1]  # the end of the run is always shown


def test_the_bar_shows_without_logging_set_up_and_the_logger_is_restored(capsys):
    logger = logging.getLogger(PROGRESS_LOGGER)
    before = (logger.level, logger.propagate, list(logger.handlers))
    stream = io.StringIO()
    with showing_progress(ProgressDisplay(stream, live=False)):
        Progress().maybe_log(force=True)
    assert "epoch 1" in stream.getvalue()
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    assert capsys.readouterr().err == ""
