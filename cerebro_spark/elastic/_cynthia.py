"""Cynthia's analytical performance model (Cynthia §3, eqs. 2-5 and 12-14), for groups.

Cynthia predicts the iteration time of distributed training from one baseline profile:
an iteration computes on the workers and communicates parameters (eq. 3: ``max(t_comp,
t_comm)`` when the two overlap, as Cynthia's BSP does, their sum when they do not); with
``n`` homogeneous workers and a fixed amount of work per iteration the computation time is
``w_iter / (n * r)`` (eq. 4) and the communication time moves ``2 * g_param`` bytes per
worker over the available bandwidth (eq. 5).

What we substituted, and why: a group unit (:mod:`cerebro_spark.training._group`) has no
parameter server; its ranks sum gradients with one ring all-reduce per step (gloo or
NCCL), in which each rank sends and receives ``2 * (g - 1) / g * g_param`` bytes, so eq. 5
becomes ``t_comm(g) = 2 * (g - 1) / g * g_param / b`` (zero for one worker), with ``b``
the bandwidth between two workers. The all-reduce runs after the backward pass, so
computation and communication do not overlap: ``t_iter = t_comp + t_comm``. The global
batch is fixed (strong scaling, as RubberBand §3 assumes and as our group units do), so
``t_comp(g) = t_base / g`` with ``t_base`` the step time measured on one worker (eq. 4
with ``w_iter = t_base * c_base``), times the workers' utilization ``u`` (Cynthia's
``r_wk = c_wk * u_wk``). Eqs. 6-7 estimate ``u`` from the parameter server's CPU and network
demand against its supply; without a parameter server the shared resource is the hosts'
CPU and memory, so ``u`` is measured directly: one unit alone against ``g`` units at once
on the same workers (``u = t_alone / t_together``; 1 when workers share nothing).

One refinement, off by default (``fixed_step_seconds = 0`` is Cynthia as written): eq. 4
divides all of an iteration's work by ``n``, but every rank also runs the whole optimizer
update and its gradient packing each step, whatever its share of the batch. With
``fixed_step_seconds = c`` (measured from one worker at two batch sizes: ``t(B) = a B +
c``), ``t_comp(g) = (t_base - c) / (g u) + c``.

From this, the speedup of a trial on ``g`` workers is ``t_iter(1) / t_iter(g)``: the pilot
(:mod:`._pilot`) writes it into a profile's ``scaling`` for the group sizes it could not
measure, and that is how the model reaches the planner.
:meth:`GroupModel.largest_useful_group` gives where the computation saved stops paying for
the traffic (after Thm. 4.1's upper bound, ``sqrt(w_iter * b / (2 * g_param * c))``), for
reading a fitted model; the planner does not use it: it bounds a stage's workers by the
profile's scaling itself (the group size past which it stops gaining,
:meth:`~._simulator.Simulator.useful_workers`), which is what the model predicted or what
was measured.

Not used: eq. 1 (a target loss to the number of iterations it takes). Cynthia chooses a
cluster for one training job that runs until a loss; here the search procedure fixes every
trial's epochs per stage (the stage spec), so the iterations are given, not predicted.
"""

from __future__ import annotations

import dataclasses
import math

from cerebro_spark.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class GroupModel:
    """Iteration time of one trial trained by ``g`` workers (module docstring).

    Attributes:
        step_seconds: ``t_base``: one optimizer step (global batch) on one worker.
        param_bytes: ``g_param``: bytes of the model's parameters (gradients are as large).
        bandwidth: ``b``: bytes per second between two workers.
        overlap: Whether computation and communication overlap (``max``, Cynthia's BSP)
            or not (sum, our all-reduce after the backward pass).
        utilization: ``u``: the share of a worker's speed it keeps while the group's other
            workers compute too (1: they share nothing).
        fixed_step_seconds: ``c``: the part of a step that does not shrink with the batch
            (0: Cynthia as written).

    Raises:
        ConfigError: A value is not a finite number ``> 0`` (``param_bytes`` may be 0).
    """

    step_seconds: float
    param_bytes: float
    bandwidth: float
    overlap: bool = False
    utilization: float = 1.0
    fixed_step_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name, low in (("step_seconds", 0.0), ("bandwidth", 0.0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > low):
                raise ConfigError(f"GroupModel.{name} must be a number > 0, got {value!r}")
        if not (math.isfinite(self.utilization) and 0 < self.utilization <= 1):
            raise ConfigError(f"GroupModel.utilization must be in (0, 1], got {self.utilization!r}")
        if not (0 <= self.fixed_step_seconds < self.step_seconds):
            raise ConfigError(
                f"GroupModel.fixed_step_seconds must be in [0, step_seconds), got "
                f"{self.fixed_step_seconds!r}"
            )
        if not (math.isfinite(self.param_bytes) and self.param_bytes >= 0):
            raise ConfigError(f"GroupModel.param_bytes must be >= 0, got {self.param_bytes!r}")

    def compute_seconds(self, group: int) -> float:
        """``t_comp``: eq. 4 with ``group`` homogeneous workers and a fixed global batch."""
        scalable = self.step_seconds - self.fixed_step_seconds
        share = scalable / group / (self.utilization if group > 1 else 1.0)
        return share + self.fixed_step_seconds

    def communicate_seconds(self, group: int) -> float:
        """``t_comm``: eq. 5 with a ring all-reduce instead of a parameter server."""
        return 2 * (group - 1) / group * self.param_bytes / self.bandwidth

    def step_time(self, group: int) -> float:
        """``t_iter``: eq. 3 (``max`` when overlapping, else the sum)."""
        if group < 1:
            raise ConfigError(f"group size must be >= 1, got {group}")
        comp, comm = self.compute_seconds(group), self.communicate_seconds(group)
        return max(comp, comm) if self.overlap else comp + comm

    def unit_seconds(self, group: int, steps: int) -> float:
        """Training time of a group unit of ``steps`` steps (eq. 2: the sum of iterations)."""
        return steps * self.step_time(group)

    def speedup(self, group: int) -> float:
        """A trial's throughput on ``group`` workers relative to one."""
        return self.step_time(1) / self.step_time(group)

    def largest_useful_group(self) -> int:
        """The group size past which communication eats the saving (after Thm. 4.1, eq. 14).

        ``ceil(sqrt(t_base * b / (2 * g_param)))``: at that size the traffic of one step
        takes about as long as its computation.
        """
        if self.param_bytes == 0:
            return 2**31
        return max(
            1, math.ceil(math.sqrt(self.step_seconds * self.bandwidth / (2 * self.param_bytes)))
        )

    def scaling_table(self, sizes: tuple[int, ...] = (1, 2, 4, 8)) -> dict[int, float]:
        """``{g: speedup(g)}`` for a profile's ``scaling`` key."""
        return {g: round(self.speedup(g), 6) for g in sizes}


def bandwidth_from(model_at_one: GroupModel, group: int, measured_step_seconds: float) -> float:
    """The bandwidth that explains a measured group step time (the model solved for ``b``).

    Raises:
        ConfigError: The measurement is not slower than the computation alone (no
            communication to explain), or ``group < 2``.
    """
    if group < 2:
        raise ConfigError(f"a bandwidth needs a group of >= 2 workers, got {group}")
    comm = measured_step_seconds - model_at_one.compute_seconds(group)
    if comm <= 0 or model_at_one.param_bytes == 0:
        raise ConfigError(
            f"the measured group step of {measured_step_seconds:.6f} s is not slower than its "
            f"computation ({model_at_one.compute_seconds(group):.6f} s): no traffic to fit"
        )
    return 2 * (group - 1) / group * model_at_one.param_bytes / comm
