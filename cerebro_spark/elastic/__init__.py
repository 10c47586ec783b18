"""The elastic layer's planning half: profiles, prices, the simulator and the planner.

Pure functions of (stage spec, profile, price catalog, deadline, budget): no Spark, no
torch. :func:`plan` returns the cheapest allocation of workers per stage that meets the
deadline and the budget (RubberBand §4, Cynthia §4) or raises :class:`PlanInfeasible`;
:class:`Simulator` predicts an allocation's time and cost (RubberBand §4.2), also for the
rest of a search re-planned mid-run with workers already running (``running``);
:class:`GroupModel` is Cynthia's performance model of a data-parallel group (Cynthia §3).
The stage spec comes from the search procedure (``SearchProcedure.stage_spec``), built from
a config exactly as ``run`` builds it (:func:`cerebro_spark.driver.experiment_spec`).
"""

from cerebro_spark.elastic._calibration import (
    LOAD_CHANGE,
    Calibration,
    calibrated,
    drift,
    load_change,
    machine_load,
    startup_calibration,
    units_calibration,
)
from cerebro_spark.elastic._cynthia import GroupModel, bandwidth_from
from cerebro_spark.elastic._planner import (
    FASTEST_SLACK,
    Plan,
    PlanInfeasible,
    fair_at_most,
    next_lower,
    plan,
    plan_deadline,
    static_sizes,
    step_candidates,
    worker_bounds,
)
from cerebro_spark.elastic._prices import InstancePrice, PriceCatalog, load_catalog, parse_catalog
from cerebro_spark.elastic._profile import (
    Latency,
    Profile,
    Scaling,
    TypeProfile,
    load_profile,
    parse_profile,
    parse_scaling,
    trial_epoch,
)
from cerebro_spark.elastic._report import format_plan
from cerebro_spark.elastic._simulator import (
    Node,
    NodeKind,
    Outcome,
    Simulator,
    StageOutcome,
    partition_moves,
)
from cerebro_spark.elastic._specs import procedure_spec
from cerebro_spark.elastic._summary import PARTS, miss_lines, overrun, planned_parts, summarize

__all__ = [
    "FASTEST_SLACK",
    "LOAD_CHANGE",
    "PARTS",
    "Calibration",
    "GroupModel",
    "InstancePrice",
    "Latency",
    "Node",
    "NodeKind",
    "Outcome",
    "Plan",
    "PlanInfeasible",
    "PriceCatalog",
    "Profile",
    "Scaling",
    "Simulator",
    "StageOutcome",
    "TypeProfile",
    "bandwidth_from",
    "calibrated",
    "drift",
    "fair_at_most",
    "format_plan",
    "load_catalog",
    "load_change",
    "load_profile",
    "machine_load",
    "miss_lines",
    "next_lower",
    "overrun",
    "parse_catalog",
    "parse_profile",
    "parse_scaling",
    "partition_moves",
    "plan",
    "plan_deadline",
    "planned_parts",
    "procedure_spec",
    "startup_calibration",
    "static_sizes",
    "step_candidates",
    "summarize",
    "trial_epoch",
    "units_calibration",
    "worker_bounds",
]
