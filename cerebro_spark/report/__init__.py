"""The experiment report: one self-contained HTML page, and summaries for terminals.

:func:`write_report` (``cerebro-spark report EXPERIMENT``) renders everything an
experiment's ``events.jsonl`` and ``config.json`` tell: the leaderboard, every trial's
learning curve coloured by the procedure's decisions, a per-worker Gantt chart of units
with worker joins, losses and resizes, the rounds (rungs, brackets), the plan beside what
each stage took and cost, how long units waited for their data (per worker, overall, the
trials that waited most), and the cost summary. Charts are plotly, with plotly.js inlined
once, so the file opens offline. The engine rewrites ``report.html`` in the experiment's
directory at round ends, in a thread beside the run (:class:`ReportRefresher`), and at the
end of a run (:func:`refresh_report`).
"""

from cerebro_spark.report._api import (
    REPORT_NAME,
    Report,
    ReportRefresher,
    build_report,
    load_report_data,
    refresh_report,
    write_report,
)
from cerebro_spark.report._data import (
    DataWait,
    ReportData,
    WaitRow,
    collect,
    data_wait,
    trial_seconds,
    trial_usd,
)
from cerebro_spark.report._terminal import (
    check_metric,
    data_wait_text,
    failures_text,
    leaderboard_json,
    metric_mode,
    rejudge,
    summary_text,
)

__all__ = [
    "REPORT_NAME",
    "DataWait",
    "Report",
    "ReportData",
    "ReportRefresher",
    "WaitRow",
    "build_report",
    "check_metric",
    "collect",
    "data_wait",
    "data_wait_text",
    "failures_text",
    "leaderboard_json",
    "load_report_data",
    "metric_mode",
    "refresh_report",
    "rejudge",
    "summary_text",
    "trial_seconds",
    "trial_usd",
    "write_report",
]
