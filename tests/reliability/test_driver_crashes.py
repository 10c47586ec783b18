"""The driver killed (SIGKILL, SIGINT) at awkward moments, and resumed (issue 12, part 6).

Every case ends with the results of an uninterrupted run of the same config: the same
final checkpoint digests, metrics and best epochs, every unit done exactly once.
"""

from __future__ import annotations

import logging
import shutil
import signal
from pathlib import Path

import pytest

from cerebro_spark.cli import main
from cerebro_spark.engine import resume_experiment
from tests.reliability.conftest import (
    Driver,
    outcome,
    strict_events,
    tiny_config,
    unit_ends,
    whole_lines,
    write_config,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

UNITS = 4 * 2 * 2 * 2  # trials x epochs x partitions x (train, validate)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_reference):
    """This module's store: a copy of the session's reference store (its prepared dataset
    and ``experiments/reference``, the uninterrupted run), which the cases add to."""
    store = tmp_path_factory.mktemp("store") / "store"
    shutil.copytree(tiny_reference.store, store)
    return store


@pytest.fixture(scope="module")
def reference(tiny_reference):
    return tiny_reference.outcome


def start(store: Path, tmp_path: Path, experiment_id: str, **changes) -> Driver:
    config = write_config(tmp_path / f"{experiment_id}.yaml", tiny_config(store, **changes))
    return Driver(["run", str(config), "--experiment-id", experiment_id])


def after_units(count: int):
    return lambda events: len(unit_ends(events)) >= count


def tear(events_file: Path) -> None:
    """Leave half an event at the end, as a kill in the middle of an append does."""
    with open(events_file, "ab") as out:
        out.write(b'{"event":"unit_end","time":1.0,"round":0,"tri')


def check_finished(store: Path, experiment_id: str, reference) -> list:
    events, state = strict_events(str(store), experiment_id)
    assert state.finished
    assert outcome(state) == reference
    ends = unit_ends(events)
    assert len(ends) == len(set(ends)) == UNITS  # none lost, none done twice
    assert [e["event"] for e in events].count("experiment_end") == 1
    return events


def test_sigint_of_the_driver_exits_130_and_resume_finishes(reference, store, tmp_path):
    driver = start(store, tmp_path, "sigint")
    events_file = store / "experiments/sigint/events.jsonl"
    driver.wait_for(events_file, after_units(6))
    assert driver.kill(signal.SIGINT) == 130
    assert "continue with 'cerebro-spark resume'" in driver.output()
    events, state = strict_events(str(store), "sigint")
    assert not state.finished
    kept = set(unit_ends(events))
    resume_experiment(str(store), "sigint")
    assert kept <= set(unit_ends(check_finished(store, "sigint", reference)))


def test_a_torn_log_resumed_killed_and_resumed_again(reference, store, tmp_path):
    driver = start(store, tmp_path, "torn")
    events_file = store / "experiments/torn/events.jsonl"
    driver.wait_for(events_file, after_units(4))
    driver.kill(signal.SIGKILL)
    tear(events_file)
    done = len(unit_ends(whole_lines(events_file)))
    second = Driver(["resume", str(store / "experiments/torn")])
    second.wait_for(events_file, after_units(done + 4))
    second.kill(signal.SIGKILL)
    tear(events_file)
    resume_experiment(str(store), "torn")
    check_finished(store, "torn", reference)
    assert events_file.read_bytes().count(b'"tri\n') == 0  # no torn half left inside


@pytest.mark.parametrize("cut", ["after_last_round_end", "before_experiment_end"])
def test_a_kill_during_the_final_sweep_resumes_to_the_same_end(reference, store, cut):
    """The log as a kill leaves it between the last round's end and ``experiment_end``
    (the best checkpoint and the leaderboard not written yet)."""
    target = store / f"experiments/sweep-{cut}"
    shutil.copytree(store / "experiments/reference", target)
    lines = (target / "events.jsonl").read_bytes().splitlines(keepends=True)
    kinds = [line.split(b'"event":"', 1)[1].split(b'"', 1)[0].decode() for line in lines]
    last_round_end = len(kinds) - 1 - kinds[::-1].index("round_end")
    keep = last_round_end + 1 if cut == "after_last_round_end" else kinds.index("experiment_end")
    (target / "events.jsonl").write_bytes(b"".join(lines[:keep]))
    for name in ("leaderboard.csv", "best.pt"):
        (target / name).unlink(missing_ok=True)
    resume_experiment(str(store), target.name)
    events, state = strict_events(str(store), target.name)
    assert state.finished and outcome(state) == reference
    assert [e["event"] for e in events].count("experiment_end") == 1
    assert (target / "leaderboard.csv").exists() and (target / "best.pt").exists()


def test_a_sigkill_after_the_last_round_ends_resumes_to_the_same_end(reference, store, tmp_path):
    """A real SIGKILL once the last round has ended: the driver is writing the leaderboard,
    ``best.pt`` and the final report (the kill lands before ``experiment_end`` but for a
    very fast machine, which the test reports as a skip)."""
    rounds = [e for e in strict_events(str(store), "reference")[0] if e["event"] == "round_end"]
    driver = start(store, tmp_path, "sweep-kill")
    events_file = store / "experiments/sweep-kill/events.jsonl"
    driver.wait_for(
        events_file, lambda events: sum(e["event"] == "round_end" for e in events) == len(rounds)
    )
    driver.kill(signal.SIGKILL)
    _, state = strict_events(str(store), "sweep-kill")
    if state.finished:
        pytest.skip("the driver finished before the kill landed")
    resume_experiment(str(store), "sweep-kill")
    check_finished(store, "sweep-kill", reference)


def test_a_resume_after_the_prepared_dataset_was_deleted_rebuilds_it(reference, store, tmp_path):
    driver = start(store, tmp_path, "nodata")
    events_file = store / "experiments/nodata/events.jsonl"
    driver.wait_for(events_file, after_units(6))
    driver.kill(signal.SIGKILL)
    shutil.rmtree(store / "datasets")  # the source (sklearn:iris) can make it again
    resume_experiment(str(store), "nodata")
    check_finished(store, "nodata", reference)


def test_a_resume_after_a_named_dataset_was_deleted_is_refused_clearly(
    reference, store, tmp_path, caplog
):
    prepared = next((store / "datasets").iterdir())
    elsewhere = tmp_path / "dataset"
    shutil.copytree(prepared, elsewhere)
    driver = start(store, tmp_path, "gone", data={"dataset": str(elsewhere)})
    events_file = store / "experiments/gone/events.jsonl"
    driver.wait_for(events_file, after_units(6))
    driver.kill(signal.SIGKILL)
    shutil.move(elsewhere, tmp_path / "moved")
    with caplog.at_level(logging.ERROR):
        assert main(["resume", str(store / "experiments/gone")]) == 2
    assert f"no manifest.json at {elsewhere}/manifest.json" in caplog.text
    assert "Traceback" not in caplog.text
    events, state = strict_events(str(store), "gone")
    assert not state.finished and len(unit_ends(events)) >= 6
    shutil.move(tmp_path / "moved", elsewhere)
    resume_experiment(str(store), "gone")
    check_finished(store, "gone", reference)


@pytest.mark.parametrize("command", ["leaderboard", "report", "resume", "replay"])
def test_every_reader_refuses_a_damaged_log_naming_the_line(reference, store, command, caplog):
    """An invalid line in the middle (what an append behind a torn line used to leave):
    every command refuses it in one line naming the file and the line, and writes nothing."""
    target = store / f"experiments/damaged-{command}"
    shutil.copytree(store / "experiments/reference", target)
    lines = (target / "events.jsonl").read_bytes().splitlines(keepends=True)
    lines[9] = lines[9][:25] + b"\n"
    (target / "events.jsonl").write_bytes(b"".join(lines))
    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    with caplog.at_level(logging.ERROR):
        assert main([command, str(target)]) == 2
    assert f"{target / 'events.jsonl'}: line 10 of {len(lines)} is not an event" in caplog.text
    assert "Traceback" not in caplog.text
    assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("command", ["leaderboard", "report", "resume", "replay"])
@pytest.mark.parametrize("damage", ["emptied", "headless"])
def test_every_reader_refuses_a_log_that_lost_its_beginning(store, command, damage, caplog):
    """An emptied events.jsonl (or one whose first lines were cut) next to a finished run's
    files: refused in one line, nothing rewritten (resume would re-train the experiment
    and replace best.pt; leaderboard and report would show it empty)."""
    target = store / f"experiments/{damage}-{command}"
    shutil.copytree(store / "experiments/reference", target)
    log = target / "events.jsonl"
    log.write_bytes(b"" if damage == "emptied" else b"".join(log.read_bytes().splitlines(True)[3:]))
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    with caplog.at_level(logging.ERROR):
        assert main([command, str(target)]) == 2
    expected = "is empty or missing, but the run left" if damage == "emptied" else "begins with a"
    assert f"its event log {log}" in caplog.text and expected in caplog.text
    assert "restore it from a copy (nothing was changed)" in caplog.text
    assert "Traceback" not in caplog.text
    after = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert after == before
    assert not list(store.glob(f"experiments/{damage}-{command}-replay-*"))


def test_a_replay_refused_leaves_no_replay_behind(store, caplog):
    """More workers than partitions: refused before the replay's id is claimed."""
    target = store / "experiments/reference"
    with caplog.at_level(logging.ERROR):
        assert main(["replay", str(target), "--workers", "5"]) == 2
    assert "workers=5 exceeds num_partitions=2" in caplog.text
    assert not list(store.glob("experiments/reference-replay-*"))


def test_an_experiment_that_never_started_is_no_damaged_log(store, tmp_path):
    """config.json and nothing else (a driver killed before its first event): resumable."""
    target = store / "experiments/unstarted"
    target.mkdir()
    shutil.copy(store / "experiments/reference/config.json", target / "config.json")
    assert main(["leaderboard", str(target)]) == 0


@pytest.mark.parametrize("command", ["leaderboard", "report"])
def test_every_reader_reads_a_torn_log(reference, store, command, caplog):
    target = store / f"experiments/torn-{command}"
    shutil.copytree(store / "experiments/reference", target)
    data = (target / "events.jsonl").read_bytes()
    cut = data.rstrip(b"\n").rfind(b"\n") + 1
    (target / "events.jsonl").write_bytes(data[: cut + 30])  # experiment_end torn
    with caplog.at_level(logging.WARNING):
        assert main([command, str(target)]) == 0
    assert "ignoring a torn last line" in caplog.text
