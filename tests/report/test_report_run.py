"""The report of a real elastic run: its data, its page in a real headless Chromium, the CLI.

The run (``conftest.real_run``) trains real torch models in LocalBackend processes.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from cerebro_spark.cli import main
from cerebro_spark.report import REPORT_NAME, build_report, load_report_data
from cerebro_spark.tuner import TuningResult
from tests.report.browser import Chromium, chromium_path
from tests.report.conftest import PRICE, RealRun, events_of

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_the_data_is_the_log(real_run: RealRun) -> None:
    data = load_report_data(str(real_run.store), real_run.experiment_id)
    events = events_of(real_run)
    ends = [e for e in events if e["event"] == "unit_end"]
    failed = [e for e in events if e["event"] == "unit_failed"]
    # One bar per unit that ended or failed; each on the worker that ran it.
    kinds = Counter(u.kind for u in data.units)
    assert kinds["train"] + kinds["validate"] == len(ends) and kinds["failed"] == len(failed)
    assert kinds["unfinished"] == 0 and set(data.workers) == {"w0", "w1"}
    # A worker runs one unit at a time: its bars never overlap.
    by_worker = defaultdict(list)
    for unit in data.units:
        assert 0 <= unit.start <= unit.end <= data.last + 1e-6
        by_worker[unit.worker].append((unit.start, unit.end))
    for spans in by_worker.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))
    # Worker joins, the retirement of the shrink and the resize are marked.
    labels = Counter(m.label for m in data.markers)
    assert labels["joined"] == 2 and labels["retired"] >= 1 and labels["resized"] == 1
    assert labels["stage 1 ended"] == 1 and labels["stage 2 ended"] == 1  # shown from 1
    # Curves: every validated epoch with the decision taken after it.
    assert {t: [p.epoch for p in points] for t, points in data.curves.items()} == {
        t.trial_id: list(range(1, t.epochs + 1)) for t in data.state.trials.values() if t.history
    }
    decided = Counter(p.status for points in data.curves.values() for p in points)
    assert decided["paused"] >= 1 and decided["completed"] >= 1 and decided["stopped"] >= 1
    # Rounds: round 0 trained the 4 trials at epoch 0; round 1 the one SHA resumed.
    assert sorted(data.rounds[0].epochs) == ["t0000", "t0001", "t0002", "t0003"]
    assert list(data.rounds[1].resumed) == list(data.rounds[1].epochs)
    assert all(epoch == 1 for epoch in data.rounds[1].epochs.values())
    # Plan vs actual, stage by stage, as logged.
    actuals = {e["stage"]: e for e in events if e["event"] == "stage_actual"}
    assert [(s.stage, s.planned_workers, s.workers) for s in data.stages] == [
        (0, 2, 2),
        (1, 1, 1),
    ]
    assert [s.seconds for s in data.stages] == [actuals[0]["seconds"], actuals[1]["seconds"]]
    # A trial's time is the sum of its unit seconds; its cost that at the run's rate.
    for trial, seconds in data.trial_seconds.items():
        assert seconds == pytest.approx(sum(e["seconds"] for e in ends if e["trial"] == trial))
    assert data.trial_usd is not None
    summary = data.state.elastic_summary
    assert summary is not None and summary["usd"] == pytest.approx(
        summary["instance_seconds"] * PRICE / 3600, rel=0.05
    )
    assert sum(data.trial_usd.values()) <= summary["usd"] + 1e-9
    assert data.unit_failures == {"trial_error": len(failed)}


def test_the_report_is_refreshed_at_round_ends_and_reloads_while_running(
    real_run: RealRun,
) -> None:
    assert 1 not in real_run.live_pages  # round 0's page is asked for once round 1 is out
    live = real_run.live_pages[2]  # written beside round 1, read before the final report
    # The second round (round 1 in the log) is shown as round 2, as progress shows it.
    assert 'http-equiv="refresh"' in live and "running (round 2;" in live
    assert "Learning curves" in live and "Workers over time" in live


def test_the_run_wrote_its_report_and_it_is_final(real_run: RealRun) -> None:
    page = (real_run.directory / REPORT_NAME).read_text()
    assert page.startswith("<!DOCTYPE html>") and 'http-equiv="refresh"' not in page
    assert "finished" in page and "Plan vs actual" in page
    # Self-contained: plotly.js is inlined once and nothing is fetched.
    assert page.count("Plotly.newPlot") == 4 and re.search(r"<script[^>]*\bsrc=", page) is None
    assert "<link" not in page and "<iframe" not in page


def test_the_page_renders_in_headless_chromium(real_run: RealRun, tmp_path: Path) -> None:
    executable = chromium_path()
    if executable is None:
        if os.environ.get("CEREBRO_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required here (CEREBRO_REQUIRE_CHROMIUM) but not installed")
        pytest.skip("chromium is not installed (.ci/run installs Debian's package)")
    output = tmp_path / "report.html"
    assert main(["report", str(real_run.directory), "--output", str(output)]) == 0
    with Chromium(executable, width=1400, height=1000) as browser:
        browser.open(output.as_uri(), settle_s=3.0)
        assert browser.errors() == []
        charts = browser.evaluate(
            "Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => {"
            " const r = d.getBoundingClientRect();"
            " return [d.id, r.left + window.scrollX, r.top + window.scrollY, r.width, r.height,"
            " d.querySelectorAll('.main-svg').length, d.querySelectorAll('.point, path.point,"
            " .trace').length]; })"
        )
        shot = browser.screenshot(tmp_path / "report.png")
        keep = os.environ.get("CEREBRO_REPORT_SCREENSHOT")
        if keep:  # to look at it
            shutil.copy(tmp_path / "report.png", keep)
        assert browser.errors() == []
    assert [c[0] for c in charts] == ["curves", "gantt", "rungs", "plan"]
    for chart_id, left, top, width, height, svgs, traces in charts:
        assert svgs >= 1 and traces >= 1 and width > 600 and height > 200, chart_id
        area = shot[int(top) : int(top + height), int(left) : int(left + width)]
        assert area.shape[0] > 200, (chart_id, shot.shape)
        not_white = np.any(area < 235, axis=2).mean()
        colours = {tuple(int(v) // 32 for v in px) for px in area.reshape(-1, 3)[::7]}
        assert not_white > 0.01, (chart_id, not_white)  # drawn, not blank
        assert len(colours) >= 5, (chart_id, len(colours))  # several distinct colours
    # The Gantt chart shows train (blue) and validation (orange) units.
    gantt = next(c for c in charts if c[0] == "gantt")
    area = shot[int(gantt[2]) : int(gantt[2] + gantt[4]), int(gantt[1]) : int(gantt[1] + gantt[3])]
    pixels = area.reshape(-1, 3).astype(int)
    assert (np.abs(pixels - (0x4C, 0x78, 0xA8)).sum(axis=1) < 30).sum() > 500
    assert (np.abs(pixels - (0xF5, 0x85, 0x18)).sum(axis=1) < 30).sum() > 500


def test_the_notebook_object_embeds_the_page(real_run: RealRun) -> None:
    report = TuningResult.load(str(real_run.store), real_run.experiment_id).report()
    assert report.html.startswith("<!DOCTYPE html>")
    assert build_report(str(real_run.store), real_run.experiment_id).experiment_id == "e1"
    shown = report._repr_html_()
    assert shown.startswith("<iframe srcdoc=") and "<script" not in shown  # escaped inside
    assert "&lt;!DOCTYPE html&gt;" in shown


def test_the_leaderboard_command(real_run: RealRun, capsys: pytest.CaptureFixture[str]) -> None:
    where = str(real_run.directory)
    assert main(["-q", "leaderboard", where]) == 0
    table = capsys.readouterr().out
    assert "seconds" in table.splitlines()[0] and "dollars" in table.splitlines()[0]
    assert "1 trial failed:" in table and "FailsInTrainingSpec refuses" in table
    assert "units that failed, by reason: 1 trial_error" in table

    assert main(["-q", "leaderboard", where, "--format", "json", "--metric", "loss"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert board["metric"] == "loss" and board["mode"] == "min"
    rows = board["trials"]
    losses = [r["loss"] for r in rows if r["loss"] is not None]
    assert losses == sorted(losses) and rows[-1]["status"] == "failed"
    assert all(r["seconds"] > 0 for r in rows if r["status"] != "failed")
    assert all("usd" in r for r in rows)

    assert main(["-q", "leaderboard", where, "--format", "csv"]) == 0
    assert capsys.readouterr().out == (real_run.directory / "leaderboard.csv").read_text()
    assert main(["-q", "leaderboard", where, "--format", "csv", "--metric", "f1_macro"]) == 0
    header = next(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert header[4:6] == ["f1_macro", "last_f1_macro"]

    assert main(["-q", "leaderboard", where, "--metric", "no_such_metric"]) == 2


def test_resume_of_a_finished_run_prints_the_summary(
    real_run: RealRun, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-q", "resume", str(real_run.directory)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("top 4 of 4 trials by accuracy (max):")
    assert "last accuracy" in out and "seconds" in out and "dollars" in out
    assert "1 trial failed:" in out and "unit-seconds on 2 workers" in out
    assert "the search cost $" in out and f"report: {real_run.directory}/report.html" in out


def test_the_report_command_writes_into_the_experiment_by_default(
    real_run: RealRun, capsys: pytest.CaptureFixture[str]
) -> None:
    page = real_run.directory / REPORT_NAME
    before = page.stat().st_mtime_ns
    # The pipelines' shape: EXPERIMENT as <store>/experiments/<id>, or an id with --store.
    assert main(["-q", "report", str(real_run.directory)]) == 0
    assert capsys.readouterr().out == f"report: {page}\n"
    assert page.stat().st_mtime_ns > before and "Plan vs actual" in page.read_text()
    assert main(["-q", "report", real_run.experiment_id, "--store", str(real_run.store)]) == 0
    assert main(["-q", "report", "no-such-id", "--store", str(real_run.store)]) == 2
