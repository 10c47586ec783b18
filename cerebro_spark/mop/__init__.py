"""Model hopper parallelism: the pure MOP scheduler (groups, packs) and its simulator."""

from cerebro_spark.mop._base import Assignment, SchedulingRule, Unit
from cerebro_spark.mop._rules import RandomizedRule, WorkAwareRule
from cerebro_spark.mop._scheduler import MopScheduler
from cerebro_spark.mop._simulator import (
    CNN_MFLOPS,
    GPU_TFLOPS,
    ScheduledUnit,
    ScheduleInstance,
    SimulationResult,
    heterogeneous_instance,
    homogeneous_instance,
    simulate,
)
from cerebro_spark.mop._visit_order import (
    VisitSlots,
    grouped_visit_orders,
    seeded_visit_orders,
    trial_visit_order,
)

__all__ = [
    "CNN_MFLOPS",
    "GPU_TFLOPS",
    "Assignment",
    "MopScheduler",
    "RandomizedRule",
    "ScheduleInstance",
    "ScheduledUnit",
    "SchedulingRule",
    "SimulationResult",
    "Unit",
    "VisitSlots",
    "WorkAwareRule",
    "grouped_visit_orders",
    "heterogeneous_instance",
    "homogeneous_instance",
    "seeded_visit_orders",
    "simulate",
    "trial_visit_order",
]
