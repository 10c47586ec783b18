"""Catalogue: one driver per experiment (issue 12, part 3).

Each case is a fault or a second driver, the exact refusal expected, and a check that the
experiment lost nothing. The lease itself is tested on a local disk and on S3 (moto's
server, conditional ``PutObject``); the last cases run two real drivers at once through the
command line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cerebro_spark.errors import LeaseError
from cerebro_spark.store import (
    LEASE_NAME,
    ExperimentLease,
    LeaseHolder,
    LocalLeaseObject,
    experiment_lease,
    lease_object,
    open_store,
)

PREFIX = "experiments/e1"


def _lease(store_uri: str, **kwargs) -> ExperimentLease:
    return experiment_lease(open_store(store_uri), PREFIX, "experiment e1", **kwargs)


def _holder(store_uri: str) -> LeaseHolder | None:
    current = lease_object(open_store(store_uri), f"{PREFIX}/{LEASE_NAME}").read()
    return None if current is None else LeaseHolder.from_bytes(current[0])


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# -- the lease object on a local disk and on S3 -------------------------------------------


@pytest.fixture(params=["local", "s3"])
def store_uri(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_server").uri("lake")


def test_lease_names_its_owner_and_is_released(store_uri):
    with _lease(store_uri, timeout=30) as lease:
        holder = _holder(store_uri)
        assert holder is not None and holder == lease.holder
        assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
        assert len(holder.token) == 32 and holder.started_at == holder.heartbeat_at
    assert _holder(store_uri) is None  # released on exit
    assert not lease.held


def test_second_driver_is_refused_naming_who_and_since_when(store_uri):
    with _lease(store_uri, timeout=30), pytest.raises(LeaseError) as refused:
        _lease(store_uri, timeout=30).acquire()
    message = str(refused.value)
    assert message.startswith("experiment e1 is driven by another driver: ")
    assert f"host {socket.gethostname()}, pid {os.getpid()}, since " in message
    assert "goes stale 30 s after its last heartbeat" in message
    assert "\n" not in message


def test_exactly_one_of_many_concurrent_takers_wins(store_uri):
    barrier = threading.Barrier(6)
    outcomes: list[str] = []
    leases = [_lease(store_uri, timeout=30) for _ in range(6)]

    def take(lease: ExperimentLease) -> None:
        barrier.wait()
        try:
            lease.acquire()
            outcomes.append("won")
        except LeaseError:
            outcomes.append("refused")

    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 5 + ["won"]
    winner = next(lease for lease in leases if lease.held)
    assert _holder(store_uri) == winner.holder
    winner.release()


def test_stale_lease_is_taken_over_and_the_stalled_driver_loses_it(store_uri):
    clock = _Clock()
    first = _lease(store_uri, timeout=60, heartbeat=10, clock=clock)
    first.acquire()
    clock.now += 30
    with pytest.raises(LeaseError, match="driven by another driver"):
        _lease(store_uri, timeout=60, clock=clock).acquire()  # 30 s: still live
    clock.now += 31  # 61 s since the last heartbeat
    second = _lease(store_uri, timeout=60, clock=clock).acquire()
    assert _holder(store_uri) == second.holder
    first.renew()  # the stalled driver wakes up: its conditional renewal fails
    with pytest.raises(LeaseError, match="lost the lease on experiment e1: another driver"):
        first.check()
    first.release()  # deletes nothing: the lease is the new driver's
    assert _holder(store_uri) == second.holder
    second.release()
    assert _holder(store_uri) is None


def test_heartbeat_keeps_the_lease_fresh(store_uri):
    with _lease(store_uri, timeout=1.2, heartbeat=0.1) as lease:
        time.sleep(0.6)
        holder = _holder(store_uri)
        assert holder is not None and holder.heartbeat_at > holder.started_at
        time.sleep(0.9)  # longer than the timeout: still live, the heartbeat renewed it
        with pytest.raises(LeaseError, match="driven by another driver"):
            _lease(store_uri, timeout=1.2).acquire()
        lease.check()


def test_lease_is_released_on_an_exception(store_uri):
    with pytest.raises(RuntimeError, match="boom"), _lease(store_uri, timeout=30):
        raise RuntimeError("boom")
    assert _holder(store_uri) is None
    _lease(store_uri, timeout=30).acquire().release()  # free again


def test_unreadable_lease_is_taken_over(store_uri):
    obj = lease_object(open_store(store_uri), f"{PREFIX}/{LEASE_NAME}")
    assert obj.create(b'{"host": "x", "pi') is not None  # torn by a crash
    with _lease(store_uri, timeout=30) as lease:
        assert _holder(store_uri) == lease.holder


def test_lease_of_a_dead_driver_on_this_host_is_taken_over_at_once(store_uri):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    now = time.time()
    stale = LeaseHolder(socket.gethostname(), pid, "f" * 32, now, now)  # fresh heartbeat
    obj = lease_object(open_store(store_uri), f"{PREFIX}/{LEASE_NAME}")
    assert obj.create(stale.to_bytes()) is not None
    with _lease(store_uri, timeout=600) as lease:
        assert _holder(store_uri) == lease.holder


def test_live_driver_on_another_host_is_never_taken_over_before_the_timeout(store_uri):
    now = time.time()
    other = LeaseHolder("another-host", 1, "e" * 32, now - 5, now - 5)
    obj = lease_object(open_store(store_uri), f"{PREFIX}/{LEASE_NAME}")
    obj.create(other.to_bytes())
    expected = r"host another-host, pid 1, since .* \(last heartbeat 5 s"
    with pytest.raises(LeaseError, match=expected):
        _lease(store_uri, timeout=60).acquire()


def test_bad_timeouts_are_refused(tmp_path, monkeypatch):
    from cerebro_spark.errors import ConfigError

    with pytest.raises(ConfigError, match="lease timeout must be > 0 seconds, got 0"):
        _lease(str(tmp_path), timeout=0)
    with pytest.raises(ConfigError, match="lease heartbeat must be > 0 and < the timeout"):
        _lease(str(tmp_path), timeout=5, heartbeat=5)
    monkeypatch.setenv("CEREBRO_LEASE_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ConfigError, match="CEREBRO_LEASE_TIMEOUT_SECONDS must be a number"):
        _lease(str(tmp_path))


def test_local_lease_leaves_no_file_behind(tmp_path):
    with _lease(str(tmp_path)):
        pass
    assert sorted(p.name for p in (tmp_path / PREFIX).iterdir()) == []
    assert isinstance(lease_object(open_store(str(tmp_path)), "x/lease.json"), LocalLeaseObject)


def test_s3_lease_uses_conditional_writes(s3_server):
    """The S3 lease is created with If-None-Match and replaced with If-Match (moto 5.2.5)."""
    uri = s3_server.uri("lake")
    obj = lease_object(open_store(uri), f"{PREFIX}/{LEASE_NAME}")
    tag = obj.create(b"one")
    assert tag is not None and obj.create(b"two") is None
    assert obj.replace(b"three", '"0000"') is None
    new_tag = obj.replace(b"three", tag)
    assert new_tag is not None and obj.read() == (b"three", new_tag)
    assert not obj.delete(tag) and obj.delete(new_tag) and obj.read() is None


# -- two real drivers through the command line --------------------------------------------

CONFIG = """\
name: leased
data: {source: "sklearn:iris", partitions: 2}
model: cerebro_spark.training:MLPSpec
epochs: 3
workers: 2
store: STORE
space: {hidden_units: {grid: [[4], [8], [16]]}, lr: 0.01}
"""

# Logged by the driver's main thread after it took the lease and wrote its first events,
# before it starts its workers (no worker_memory in CONFIG).
HELD_AT = "worker_memory not set"


def _driver(*args: str, cwd: Path, release: Path | None = None) -> subprocess.Popen[str]:
    """The CLI in a child process; with ``release``, held still once it logs ``HELD_AT``
    until a file exists at ``release`` (``tests.reliability.held_driver``)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    module = ["cerebro_spark.cli"]
    if release is not None:
        env["CEREBRO_TEST_HOLD_RELEASE"] = str(release)
        module = ["tests.reliability.held_driver", HELD_AT, "300"]
    return subprocess.Popen(
        [sys.executable, "-m", *module, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(path: Path, process: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if " ERROR " in line]


@pytest.mark.torch
@pytest.mark.slow
def test_second_driver_is_refused_while_the_first_runs(tmp_path):
    store = tmp_path / "store"
    config = CONFIG.replace("STORE", str(store)).replace("epochs: 3", "epochs: 1")
    (tmp_path / "c.yaml").write_text(config)
    # Held mid-run (lease taken, heartbeat going, first events written) until the others
    # have been refused, however long they take to start on a loaded host.
    release = tmp_path / "release"
    first = _driver("run", "c.yaml", "--experiment-id", "e1", cwd=tmp_path, release=release)
    try:
        experiment = store / "experiments" / "e1"
        _wait_for(experiment / "events.jsonl", first)
        log_before = (experiment / "events.jsonl").read_bytes()
        second = _driver("resume", "e1", "--store", str(store), cwd=tmp_path)
        third = _driver("run", "c.yaml", "--experiment-id", "e1", "--if-exists", "resume",
                        cwd=tmp_path)  # fmt: skip
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 2, out
        errors = _error_lines(out)
        assert len(errors) == 1 and "Traceback" not in out, out
        assert (
            f"experiment e1 in {store} is driven by another driver: host {socket.gethostname()}, "
            f"pid {first.pid}, since "
        ) in errors[0]
        out3, _ = third.communicate(timeout=120)
        assert third.returncode == 2 and f"pid {first.pid}, since " in out3, out3
        assert first.poll() is None  # still held: the others were refused while it ran
        release.touch()
        out1, _ = first.communicate(timeout=300)
        assert first.returncode == 0, out1
    finally:
        if first.poll() is None:  # a failed check: the held driver is not left behind
            first.kill()
            first.communicate()
    events = [json.loads(line) for line in (experiment / "events.jsonl").read_text().splitlines()]
    assert (experiment / "events.jsonl").read_bytes().startswith(log_before)
    starts = [e for e in events if e["event"] == "experiment_start"]
    assert len(starts) == 1  # the refused drivers wrote nothing
    assert events[-1]["event"] == "experiment_end"
    assert not (experiment / LEASE_NAME).exists()  # released at the end


@pytest.mark.torch
@pytest.mark.slow
def test_two_runs_of_one_id_at_once_exactly_one_wins(tmp_path):
    store = tmp_path / "store"
    (tmp_path / "c.yaml").write_text(
        CONFIG.replace("STORE", str(store)).replace("epochs: 3", "epochs: 1")
    )
    drivers = [_driver("run", "c.yaml", "--experiment-id", "same", cwd=tmp_path) for _ in "ab"]
    outputs = [d.communicate(timeout=300)[0] for d in drivers]
    codes = sorted(d.returncode for d in drivers)
    assert codes == [0, 2], outputs
    loser = outputs[[d.returncode for d in drivers].index(2)]
    (error,) = _error_lines(loser)
    assert "experiment same already exists in" in error or "is driven by another driver" in error, (
        error
    )
    events = (store / "experiments" / "same" / "events.jsonl").read_text().splitlines()
    assert sum('"experiment_start"' in line for line in events) == 1


@pytest.mark.torch
@pytest.mark.slow
def test_driver_killed_with_sigkill_is_resumed_at_once(tmp_path):
    """A SIGKILLed driver's lease names a dead pid on this host: resume takes it over."""
    store = tmp_path / "store"
    (tmp_path / "c.yaml").write_text(CONFIG.replace("STORE", str(store)))
    first = _driver("run", "c.yaml", "--experiment-id", "e1", cwd=tmp_path)
    experiment = store / "experiments" / "e1"
    _wait_for(experiment / "events.jsonl", first)
    deadline = time.monotonic() + 120
    while '"trial_epoch"' not in (experiment / "events.jsonl").read_text():
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (experiment / LEASE_NAME).exists()  # left behind by the killed driver
    resumed = _driver("resume", "e1", "--store", str(store), cwd=tmp_path)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "took over the lease on experiment e1" in out
    assert f"(pid {first.pid} on this host) is no longer running" in out
    events = [json.loads(line) for line in (experiment / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "experiment_end"
    assert not (experiment / LEASE_NAME).exists()


@pytest.mark.torch
def test_driver_that_lost_its_lease_writes_and_deletes_nothing(tmp_path):
    """Another driver takes the lease over mid-run (this one looked stalled): at its next
    heartbeat this driver finds out, and its next event raises instead of being written."""
    from cerebro_spark.backends import LocalBackend
    from cerebro_spark.engine import parse_config, run_experiment

    store = tmp_path / "store"
    config = parse_config(
        {
            "name": "lost",
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 2},
            "model": "cerebro_spark.training:MLPSpec",
            "epochs": 1,
            "workers": 1,
            "space": {"hidden_units": [8]},
        }
    )
    experiment = store / "experiments" / "e1"
    now = time.time()
    thief = LeaseHolder("another-host", 7, "a" * 32, now, now + 3600)

    def stealing_factory(cfg):
        obj = lease_object(open_store(str(store)), f"experiments/e1/{LEASE_NAME}")
        _, tag = obj.read()
        assert obj.replace(thief.to_bytes(), tag) is not None  # the other driver's takeover
        time.sleep(0.6)  # this driver's heartbeat (every 0.2 s) notices
        return LocalBackend(cfg.workers)

    with pytest.raises(LeaseError, match=r"lost the lease on experiment e1 in .*: another driver"):
        run_experiment(
            config, experiment_id="e1", backend_factory=stealing_factory, lease_timeout=1.2
        )
    assert _holder(str(store)) == thief  # not released: it is the other driver's
    events = [json.loads(line)["event"] for line in (experiment / "events.jsonl").open()]
    assert events == ["experiment_start", "dataset"]  # nothing after the takeover
    assert not (experiment / "checkpoints").exists()
