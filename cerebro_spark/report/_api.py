"""Build, write and refresh an experiment's HTML report."""

from __future__ import annotations

import html
import logging
import threading
import time
from pathlib import Path

from cerebro_spark.driver import ExperimentConfig, experiment_prefix, read_events
from cerebro_spark.driver._heap import paused_collector
from cerebro_spark.driver._stored import load_experiment_config, read_experiment_events
from cerebro_spark.report._data import ReportData, collect
from cerebro_spark.report._html import render
from cerebro_spark.store import Store, open_store

logger = logging.getLogger(__name__)

REPORT_NAME = "report.html"
"""The report's name in the experiment's directory."""

REFRESH_SHARE = 0.1
"""At most this share of a run's time goes into refreshing its report at round ends: a
refresh is skipped while less than ``build seconds / REFRESH_SHARE`` have passed since the
last one (the report at the run's end is always written)."""


class Report:
    """An experiment's report page; shows itself in a notebook cell.

    Attributes:
        experiment_id: The experiment.
        html: The whole page (self-contained: it opens offline).
    """

    def __init__(self, experiment_id: str, page: str) -> None:
        self.experiment_id = experiment_id
        self.html = page

    def save(self, path: str | Path) -> Path:
        """Write the page to a local file and return its path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.html, encoding="utf-8")
        return target

    def _repr_html_(self) -> str:
        """The page in an iframe (``srcdoc``), so its scripts and styles stay its own."""
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
            'style="width:100%;height:900px;border:1px solid #ddd" '
            'sandbox="allow-scripts allow-popups allow-downloads"></iframe>'
        )

    def __repr__(self) -> str:
        return f"Report({self.experiment_id!r}, {len(self.html)} characters)"


def load_report_data(store_uri: str, experiment_id: str) -> ReportData:
    """Read an experiment's config and events and extract what its report shows.

    Raises:
        ConfigError: There is no such experiment.
        EventLogError: Its log is damaged beyond what a crash leaves.
    """
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id)
    return collect(experiment_id, config, read_experiment_events(store, experiment_id))


def build_report(store_uri: str, experiment_id: str) -> Report:
    """Build an experiment's report from its store (finished, running or interrupted)."""
    with paused_collector():  # a whole log's events and a bar per unit: no cycle among them
        data = load_report_data(store_uri, experiment_id)
        return Report(experiment_id, render(data))


def write_report(store_uri: str, experiment_id: str, output: str | Path | None = None) -> str:
    """Write an experiment's report and return where it went.

    Args:
        store_uri: The store it lives in.
        experiment_id: Its id.
        output: A local file; default: ``report.html`` in the experiment's directory
            (in its store, which may be remote).
    """
    report = build_report(store_uri, experiment_id)
    if output is not None:
        return str(report.save(output))
    store = open_store(store_uri).child(experiment_prefix(experiment_id))
    store.put(REPORT_NAME, report.html.encode())
    return store.url(REPORT_NAME)


_refreshes: dict[str, tuple[float, float]] = {}
"""Per experiment directory: (monotonic time of the last refresh, seconds it took)."""
_refresh_lock = threading.Lock()


def refresh_report(
    store: Store, experiment_id: str, config: ExperimentConfig, *, final: bool
) -> None:
    """Rewrite ``report.html`` in a running experiment's directory; never raises.

    Called at every round end (by a :class:`ReportRefresher`; skipped while the last
    refresh is too recent, see :data:`REFRESH_SHARE`) and at the end of a run
    (``final``). A failure is logged as a warning: the report never fails a run. While
    the run goes on (not ``final``) its driver may be appending to the log: a torn last
    line is that append, read without a warning.

    Args:
        store: The experiment's directory (``experiments/<id>`` of its root store).
        experiment_id: Its id.
        config: Its config (metric and mode resolved).
        final: The run ended: always write.
    """
    where = store.url(REPORT_NAME)
    now = time.monotonic()
    with _refresh_lock:
        last = _refreshes.get(where)
    if not final and last is not None and now - last[0] < last[1] / REFRESH_SHARE:
        return
    try:
        with paused_collector():  # a whole log's events and a bar per unit: no cycle
            events = read_events(store, live=not final)
            page = render(collect(experiment_id, config, events))
        store.put(REPORT_NAME, page.encode())
    except Exception as error:  # the report must never fail the run
        logger.warning("could not write the report %s: %s: %s", where, type(error).__name__, error)
        return
    took = time.monotonic() - now
    with _refresh_lock:
        if final:
            _refreshes.pop(where, None)
        else:
            _refreshes[where] = (now, took)
    logger.debug("report %s written in %.2f s", where, took)


class ReportRefresher:
    """Refreshes a running experiment's report beside its driver, in a thread.

    A refresh reads the whole log and renders every chart: tenths of a second for a small
    run, seconds for a long one, during which every worker would wait for the driver's
    next round. :meth:`request` starts one in a thread of its own and returns at once; a
    request while one is still running is dropped (the next round end's, or the final
    refresh, shows what it would have). :meth:`wait` returns once none is running: the
    engine waits before the final refresh, and before it returns or raises, so nothing
    writes the report after the run.

    Args:
        store: The experiment's directory.
        experiment_id: Its id.
        config: Its config (metric and mode resolved).
    """

    def __init__(self, store: Store, experiment_id: str, config: ExperimentConfig) -> None:
        self.store, self.experiment_id, self.config = store, experiment_id, config
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        """Start a refresh (:func:`refresh_report`) unless one is running."""
        if self._thread is not None and self._thread.is_alive():
            logger.debug("report refresh still running: this round end's is skipped")
            return
        self._thread = threading.Thread(
            target=refresh_report,
            args=(self.store, self.experiment_id, self.config),
            kwargs={"final": False},
            name=f"report-{self.experiment_id}",
            daemon=True,  # a driver that dies does not wait for its report
        )
        self._thread.start()

    def wait(self) -> None:
        """Return once no refresh is running."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def final(self) -> None:
        """The run's last refresh, in this thread, once any other has ended."""
        self.wait()
        refresh_report(self.store, self.experiment_id, self.config, final=True)
