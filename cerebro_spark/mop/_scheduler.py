"""The MOP scheduler: Cerebro's Alg. 1-2 with replica awareness and Q/Q' fault tolerance.

Pure: no I/O, threads, clock or global state. The engine calls :meth:`MopScheduler.assign`
whenever a worker may have become idle and reports what happened with
:meth:`~MopScheduler.complete`, :meth:`~MopScheduler.fail` and the membership calls.

Group units (Cerebro §5.7, the "Horovod hybrid"; SEER's resources per trial): a trial
may be given ``k > 1`` workers that train ``k`` of its partitions at once, data-parallel
(:mod:`cerebro_spark.training._group`). The scheduler then hands out *group
assignments*; the policy that forms them is in :class:`MopScheduler`'s docstring.

Packed units (issue 27; Cerebro §7's "model batching"): trials of one architecture may
train together, up to ``pack_size`` at a time, on one worker in one pass over a
partition (:mod:`cerebro_spark.training._pack`). The scheduler then hands out *packed
assignments*; how it forms them is in the "Packs" paragraph of :class:`MopScheduler`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop._base import Assignment, SchedulingRule, Unit
from cerebro_spark.mop._matching import Matcher
from cerebro_spark.mop._offers import Offers
from cerebro_spark.mop._rules import RandomizedRule, WorkAwareRule
from cerebro_spark.units import UnitKind

_Group = tuple[tuple[int, ...], int]
"""A trial's next group: the partitions it draws from, and its size ``s``."""


class MopScheduler:
    """Schedules one epoch of model hopper parallelism (Cerebro §3.1, §5.2-§5.7).

    Every trial has one TRAIN unit per partition. Q holds the units not yet started, Q'
    (:attr:`running`) the units running, one per worker. An idle worker is offered the
    units of idle trials on partitions it holds (§5.5: the availability map, worker to
    partitions, replaces Alg. 1's ``j' = j``) and the rule picks one (Alg. 1); it moves
    from Q to Q'. On completion it leaves Q' and its trial and worker are idle again
    (Alg. 2). A worker may be freed earlier (:meth:`free_worker`: the unit's pass is
    done, its checkpoint being written): it takes other work while the unit stays in Q'
    and its trial busy until completion. If its worker fails or leaves, it moves back
    from Q' to Q (§5.6) and runs later on a worker holding its partition; workers may
    join, leave and be re-homed, and a trial whose user code failed may be dropped
    (:meth:`remove_trial`).
    The invariants of §3.1 hold throughout: each trial trains on each partition exactly
    once per epoch (completeness), two units of a trial never run at once (isolation), a
    worker runs one unit at a time (exclusivity), and a unit runs to its end or fails
    (non-preemption).

    With ``validate``, a trial's VALIDATE units (one per validation partition) become
    eligible once all its train units are complete; validation partition ``i`` is held by
    the workers holding partition ``i``, and a trial runs one validate unit at a time too.

    **Groups** (§5.7). A trial with group size ``k > 1`` (``group_sizes``) trains in
    *group assignments*: ``s`` of its train units at once on ``s`` distinct workers, each
    holding its rank's partition, as one data-parallel group unit. Validate units stay
    ordinary. A group's units move from Q to Q' together, complete together and go back
    to Q together when one member fails or leaves (§5.6 extended to groups); meanwhile the
    trial runs nowhere else, so the invariants hold with "unit" read as "assignment".

    *Group size.* Let ``d`` be the trial's train units completed this epoch and ``L =
    min(k, P - d)`` (with ``group_plans``: up to the end of the planned group containing
    position ``d``). With visit orders, the next group is the *longest prefix* of the
    next ``L`` partitions of the visit order that can be matched to distinct live workers
    holding them (a bipartite matching over the availability map); rank ``r`` trains the
    ``r``-th of them. Without, it is any ``s = min(L, M)`` remaining partitions, ``M`` the
    size of a maximum matching of the remaining partitions to live workers, ranked in the
    order of ``partitions``. ``s`` depends on the availability map only, never on which
    workers happen to be idle, so a replay that imposes the logged visit order on the same
    map forms the same groups. A group of one is an ordinary assignment.

    *Formation.* :meth:`assign` serves idle workers in sorted order; a group trial's units
    are candidates of the workers that hold one of its next group's partitions. When the
    rule picks such a unit for worker ``w``, the group is gathered from ``w`` and the other
    idle workers not yet served in this pass (a matching; ``w`` first, then sorted order)
    and starts if it is complete. If it is not, the worker is left for other trials (the
    rule is asked again without that trial's units), and the trial becomes the *waiting
    group* unless one is already waiting. Idle workers are never held back for a group:
    holding them costs idle time that the other trials could use. Instead the waiting
    group is served first at the start of every later :meth:`assign`, before the rule
    sees any worker: as soon as the idle workers can complete it, it starts. A waiting
    group therefore starts at the latest when the other trials have no units left to
    start in this epoch, since every unit ends (non-preemption) and all workers are then
    idle together; there is at most one waiting group, so two groups never wait on each
    other's workers.

    **Packs** (issue 27). Trials with the same *pack key* (``pack_keys``: same
    architecture, so :func:`~cerebro_spark.training._pack.run_pack` can stack them) may
    train one partition together on one worker: a *packed assignment* of up to
    ``pack_size`` train units of distinct trials (:attr:`Assignment.pack`). Validate
    units and trials with a group size ``k > 1`` (or a group plan) are never packed.

    *Formation.* Packs form in :meth:`assign`, after the rule has picked a train unit
    ``u`` (trial ``t``, partition ``p``) for idle worker ``w`` exactly as without packs:
    if ``t`` has a pack key, its *mates* are the other idle trials with the same key
    (and no group) whose next train unit may be ``p``: without visit orders, ``p`` is
    among their remaining train units; with visit orders, ``p`` is the next partition of
    their order, so every member keeps its own order and its own step
    (:attr:`Assignment.steps`). If at most ``pack_size - 1`` mates exist, all join;
    otherwise the rule picks them, asked again and again on the mates' units on ``p``
    (for :class:`WorkAwareRule`, the mates with the most work left join; for
    :class:`RandomizedRule`, uniformly random ones), so the same state and the same
    ``rng`` form the same packs, and the rule's priorities hold within a pack as across
    them. The pack is ``u`` first, then its mates in trial order. With ``pack_size=1``,
    or no keys, nothing is drawn from ``rng`` beyond what the rule draws without packs:
    the assignments are exactly those of an unpacked scheduler.

    A worker never waits for a fuller pack: a pack starts with the mates that are idle
    now (a pack of one is an ordinary assignment). Holding an idle worker would cost
    idle time that a pack of fewer trials uses; a trial busy elsewhere joins a later
    pack on that partition, or trains alone.

    *Members.* Each member of a pack is a unit of its own trial: :meth:`complete` or
    :meth:`fail` of one member releases that trial only (a member whose loss turned NaN
    fails alone, its unit back to Q; or the driver calls :meth:`remove_trial`), and the
    others run on. The worker is busy until every member completed or failed, or until
    :meth:`free_worker` frees it for the whole pack at once (the pass is done; the
    checkpoints are being written). A lost worker (:meth:`remove_worker`) sends every
    member still running back to Q (§5.6). A trial leaves future packs when it is
    removed, when :meth:`set_pack_key` clears its key, or when it gets a group size
    ``k > 1``. The invariants hold with exclusivity read as "a worker runs one pack at
    a time" and isolation per member: a trial is in at most one running assignment.

    *Cost.* With :class:`RandomizedRule` or :meth:`WorkAwareRule.per_trial`, no group
    trial, no packing (``pack_size`` 1 or no keys), and partitions (and validation
    partitions) given in ascending order, the scheduler keeps the idle trials' units in
    an index by partition and rank (:mod:`cerebro_spark.mop._offers`): a decision costs
    ``O(log |S|)`` per partition the worker holds, and a trial's rank is recomputed only
    when its queue changed. The choices, and the draws from ``rng``, are those of the
    rule on the full candidate list. Otherwise (another rule, groups, packs) every
    decision lists the candidates, and a pack its mates: ``O(|S|)`` each.

    Args:
        trials: Ids of the trials trained this epoch (unique).
        partitions: Indices of the train partitions (unique, at least one).
        workers: The availability map: live worker id to the partition indices it holds.
        rng: Randomness for the rule; nothing else draws from it.
        rule: Picks among an idle worker's candidates; :class:`RandomizedRule` if None.
        visit_orders: If given, trial ``t``'s ``k``-th train unit is on partition
            ``visit_orders[t][k]`` (a permutation of ``partitions``), so replays train
            identical weights (§3.1 "Reproducibility"). If None, any remaining partition
            of an idle trial may go to an idle worker holding it (Alg. 1).
        validate: Whether the epoch ends with validate units.
        validation_partitions: Indices of the validation partitions; default
            ``partitions``. Only with ``validate``.
        completed: Units already complete this epoch (resume after a driver crash); with
            ``visit_orders``, a trial's completed train units must be a prefix of its order.
        group_sizes: Trial id to its group size ``k >= 1`` (default 1: ordinary units).
        group_plans: Trial id to the sizes of its successive groups along its visit order
            (positive, summing to the number of partitions), e.g. the groups a logged run
            formed, imposed on its replay; overrides ``group_sizes`` for that trial. A
            planned group still shrinks to what the availability map can match. Only with
            ``visit_orders``.
        pack_keys: Trial id to its pack key (trials with equal keys may be packed; a
            trial without a key is never packed). Keys are non-empty strings, e.g.
            :func:`~cerebro_spark.training._pack.pack_fingerprint`.
        pack_size: Most trials in one pack (an integer ``>= 1``; 1: packing off).

    Raises:
        ConfigError: An argument breaks the rules above (the message names the value).
    """

    def __init__(
        self,
        *,
        trials: Sequence[str],
        partitions: Sequence[int],
        workers: Mapping[str, Collection[int]],
        rng: np.random.Generator,
        rule: SchedulingRule | None = None,
        visit_orders: Mapping[str, Sequence[int]] | None = None,
        validate: bool = True,
        validation_partitions: Sequence[int] | None = None,
        completed: Iterable[Unit] = (),
        group_sizes: Mapping[str, int] | None = None,
        group_plans: Mapping[str, Sequence[int]] | None = None,
        pack_keys: Mapping[str, str] | None = None,
        pack_size: int = 1,
    ) -> None:
        if len(set(trials)) != len(trials):
            raise ConfigError(f"trials {list(trials)!r} has duplicates; trial ids must be unique")
        self._trials = tuple(trials)
        self._partitions = _indices("partitions", partitions)
        if validation_partitions is not None and not validate:
            raise ConfigError(
                f"validation_partitions={list(validation_partitions)!r} given with "
                "validate=False; pass validate=True or leave them out"
            )
        if not validate:
            self._val_partitions: tuple[int, ...] = ()
        elif validation_partitions is None:
            self._val_partitions = self._partitions
        else:
            self._val_partitions = _indices("validation_partitions", validation_partitions)
        self._known = frozenset(self._partitions) | frozenset(self._val_partitions)
        self._rng = rng
        self._rule: SchedulingRule = RandomizedRule() if rule is None else rule
        self._ordered = visit_orders is not None
        self._orders = {t: self._partitions for t in self._trials}
        if visit_orders is not None:
            self._orders = _check_orders(visit_orders, self._trials, self._partitions)
        self._sizes = {t: 1 for t in self._trials}
        for trial, size in (group_sizes or {}).items():
            self._sizes[self._check_trial(trial, "group_sizes")] = _group_size(trial, size)
        self._plan_ends: dict[str, tuple[int, ...]] = {}
        if group_plans is not None:
            if not self._ordered:
                raise ConfigError(
                    "group_plans need visit_orders: a plan sizes the groups along a "
                    "trial's visit order"
                )
            for trial, plan in group_plans.items():
                self._check_trial(trial, "group_plans")
                self._plan_ends[trial] = _plan_ends(trial, plan, len(self._partitions))
        self._pack_size = _pack_size(pack_size)
        self._keys: dict[str, str] = {}
        for trial, key in (pack_keys or {}).items():
            self._keys[self._check_trial(trial, "pack_keys")] = _pack_key(trial, key)
        self._held: dict[str, frozenset[int]] = {}
        for worker, held in workers.items():
            self._held[worker] = self._check_held(worker, held)
        # Q, per trial and kind, in canonical order (visit order, else partition order).
        self._queue = {
            (t, kind): {p: Unit(t, p, kind) for p in self._canonical(t, kind)}
            for t in self._trials
            for kind in UnitKind
        }
        self._steps = {(t, kind): 0 for t in self._trials for kind in UnitKind}
        self._running: dict[str, Assignment] = {}  # Q', by worker (each member of a group)
        self._busy: dict[str, Assignment] = {}  # trial -> its running assignment
        self._waiting: str | None = None  # the waiting group's trial
        for unit in completed:
            self._take_completed(unit)
        self._check_resume_state()
        self._queued = sum(len(units) for units in self._queue.values())  # |Q|
        self._positions = {t: i for i, t in enumerate(self._trials)}
        self._worker_order: list[str] | None = None  # sorted live workers, cached
        self._held_order = {w: tuple(sorted(held)) for w, held in self._held.items()}
        self._grouping = self._group_trials()
        self._grouped = frozenset(self._grouping)
        self._offers: Offers | None = None
        self._dirty: set[str] = set()  # trials whose offers must be recomputed
        if self._indexable():
            self._offers = Offers()
            self._dirty = set(self._trials)

    # ---------------------------------------------------------------- state

    @property
    def running(self) -> Mapping[str, Assignment]:
        """Q': the running assignments, by worker (a group under each of its workers).

        An assignment whose worker was freed (:meth:`free_worker`) is in Q' still, but
        under no worker here.
        """
        return dict(self._running)

    @property
    def remaining(self) -> Mapping[str, Sequence[Unit]]:
        """Q: every trial of the epoch to its units not yet started (train first)."""
        return dict(_QueueView(self._trials, self._queue))

    @property
    def workers(self) -> Mapping[str, frozenset[int]]:
        """The availability map: live worker id to the partitions it holds."""
        return dict(self._held)

    @property
    def group_sizes(self) -> Mapping[str, int]:
        """Every trial's group size ``k`` (1: ordinary units); see ``group_plans`` too."""
        return dict(self._sizes)

    @property
    def pack_keys(self) -> Mapping[str, str]:
        """Every trial with a pack key, to its key (see "Packs" above)."""
        return dict(self._keys)

    @property
    def pack_size(self) -> int:
        """Most trials in one pack (1: packing off)."""
        return self._pack_size

    @property
    def waiting_group(self) -> str | None:
        """The trial of the waiting group (served first by :meth:`assign`), if any."""
        return self._waiting

    @property
    def finished(self) -> bool:
        """Whether every unit of the epoch is complete (Q and Q' are empty)."""
        return not self._busy and not self._queued

    @property
    def stalled(self) -> bool:
        """Whether units remain, none runs, and no live worker can take any of them.

        The engine must then re-home partitions (:meth:`set_partitions`, :meth:`add_worker`;
        see :attr:`unheld_partitions`) or give up.
        """
        if self.finished or self._busy:
            return False
        groups = self._next_groups()
        return not any(self._candidates(worker, groups, ()) for worker in self._held)

    @property
    def unheld_partitions(self) -> frozenset[int]:
        """Partitions of units in Q that no live worker holds."""
        held = frozenset[int]().union(*self._held.values())
        return frozenset(p for units in self._queue.values() for p in units if p not in held)

    # ---------------------------------------------------------------- Alg. 1-2

    def assign(self) -> list[Assignment]:
        """Hand work to every idle worker that can get some (Alg. 1, one pass; §5.7).

        The waiting group, if any, starts first if the idle workers can complete it (see
        the class docstring). Then idle workers are served in sorted id order; for each,
        the rule picks among the units of idle trials on partitions it holds, a pick of a
        group trial gathers the rest of its group from the idle workers not yet served,
        and a pick of a train unit of a trial with a pack key gathers its mates (see
        "Packs" in the class docstring). The units move from Q to Q'.

        Returns:
            The new assignments, in the order they were made.

        Raises:
            ConfigError: The rule returned a unit that was not a candidate.
        """
        if self._offers is not None:
            return self._assign_indexed(self._offers)
        made: list[Assignment] = []
        idle = [w for w in self._workers_sorted() if w not in self._running]
        taken: set[str] = set()  # idle workers given work in this pass
        groups = self._next_groups()
        if self._waiting is not None:
            started = self._serve_waiting(idle, groups, taken)
            if started is not None:
                made.append(started)
        for worker in idle:
            if worker in taken:
                continue
            excluded = {self._waiting} if self._waiting is not None else set()
            while True:
                candidates = self._candidates(worker, groups, excluded)
                if not candidates:
                    break
                view = _QueueView(self._trials, self._queue)
                unit = self._rule.choose(worker, candidates, view, self._rng)
                if unit not in candidates:
                    raise ConfigError(
                        f"rule {self._rule!r} chose {unit!r} for worker {worker!r}, which is "
                        f"not one of its candidates {list(candidates)!r}"
                    )
                group = groups.get(unit.trial) if unit.kind is UnitKind.TRAIN else None
                if group is None or group[1] < 2:
                    mates = self._mates(worker, unit)
                    made.append(self._start_pack(worker, unit, mates))
                    taken.add(worker)
                    break
                free = [w for w in idle if w not in taken and w != worker]
                chosen, matcher = self._gather(group, [worker], free)
                if len(chosen) == group[1]:
                    made.append(self._start_group(unit.trial, chosen, matcher))
                    taken.update(chosen)
                    break
                if self._waiting is None:
                    self._waiting = unit.trial
                excluded.add(unit.trial)  # it cannot start now: serve another trial
        return made

    def upcoming(self, workers: Collection[str], limit: int) -> dict[str, list[str]]:
        """The idle trials each of ``workers`` may run next: whose checkpoints to read ahead.

        Trial ``t`` is listed for worker ``w`` when ``t`` is idle (in no running
        assignment) and ``w`` holds the partition of a unit that :meth:`assign` could
        offer ``w`` for ``t`` now: its next train unit in its visit order (any remaining
        train unit without visit orders), or, with its train units done, a validate
        unit. A worker that is busy is listed as if it were idle: what it is offered once
        free comes from these trials, or from trials that finish elsewhere meanwhile.
        Trials that train in groups are not listed (their units span workers). At most
        ``limit`` trials per worker, in trial order. Pure: nothing is drawn or changed
        (issue 27 part 3: the engine hints the workers' next checkpoints with it).

        Raises:
            ConfigError: ``limit`` is not a positive int.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"limit must be a positive int, got {limit!r}")
        wanted = [w for w in workers if w in self._held]
        out: dict[str, list[str]] = {w: [] for w in wanted}
        holders: dict[int, list[str]] = {}
        for worker in wanted:
            for partition in self._held[worker]:
                holders.setdefault(partition, []).append(worker)
        full = 0
        for trial in self._trials:
            if full == len(wanted):
                break
            if trial in self._busy or self._sizes[trial] > 1 or trial in self._plan_ends:
                continue
            train = self._queue[trial, UnitKind.TRAIN]
            queue = train or self._queue[trial, UnitKind.VALIDATE]
            if not queue:
                continue
            parts = (next(iter(train)),) if self._ordered and queue is train else tuple(queue)
            listed: set[str] = set()
            for partition in parts:
                for worker in holders.get(partition, ()):
                    if worker not in listed and len(out[worker]) < limit:
                        listed.add(worker)
                        out[worker].append(trial)
                        full += len(out[worker]) == limit
        return out

    def complete(self, unit: Unit, *, worker: str | None = None) -> None:
        """Record that a running unit finished (Alg. 2): it leaves Q' for good.

        For a group assignment, ``unit`` may be any of its units: the whole group
        completes, and the trial's next train unit is at ``step + size``. For a packed
        assignment, only ``unit``'s member completes; its worker is idle once every
        member completed or failed (or was freed).

        Args:
            unit: The unit.
            worker: If given, the worker that reports it; must be one running it, so a
                stale report from a worker the unit was taken from is refused.

        Raises:
            ConfigError: ``unit`` is not running (on ``worker``).
        """
        units = self._release(unit, worker, "complete")
        self._steps[unit.trial, unit.kind] += len(units)
        self._dirty.add(unit.trial)

    def free_worker(self, worker: str, unit: Unit) -> None:
        """Record that ``unit`` needs its worker no more (only its checkpoint write is left).

        The worker is idle again and :meth:`assign` may give it work; the unit stays in Q'
        (its trial busy: isolation) until :meth:`complete` or :meth:`fail`. Only an
        ordinary or packed assignment frees its worker early; ``unit`` may be any member
        of a pack, and frees the worker for every member at once (one pass trained them
        all), each staying in Q' until its own completion. Nothing happens unless
        ``worker`` runs ``unit`` (it was completed, failed or removed meanwhile).

        Raises:
            ConfigError: ``worker`` runs ``unit`` in a group assignment.
        """
        assignment = self._running.get(worker)
        if assignment is None or not _member(assignment, unit):
            return
        if assignment.size != 1:
            raise ConfigError(
                f"worker {worker!r} runs a group assignment of trial "
                f"{assignment.unit.trial!r}: a group frees its workers when it completes"
            )
        del self._running[worker]

    def fail(self, unit: Unit, *, worker: str | None = None) -> None:
        """Record that a running unit must be retried (§5.6): it moves from Q' back to Q.

        Its trial and worker are idle again; the worker stays live. For a group
        assignment, ``unit`` may be any of its units: all of them go back to Q and all its
        workers are idle again. For a packed assignment, only ``unit`` goes back to Q;
        the other members run on, and the worker is idle once they are all done.

        Args:
            unit: The unit.
            worker: If given, must be a worker running it.

        Raises:
            ConfigError: ``unit`` is not running (on ``worker``).
        """
        self._requeue(self._release(unit, worker, "fail"))
        self._dirty.add(unit.trial)

    def remove_trial(self, trial: str) -> None:
        """Drop a trial from the epoch (its user code failed, or the search stopped it).

        Its units leave Q, and Q' if it is running (its workers are idle again; a pack's
        worker once its other members are done too); units it completed stay complete.
        Completeness then holds for the other trials only.

        Raises:
            ConfigError: ``trial`` is not a trial of this epoch.
        """
        self._check_trial(trial)
        assignment = self._busy.pop(trial, None)
        if assignment is not None:
            self._unrun(assignment)
        if self._waiting == trial:
            self._waiting = None
        for kind in UnitKind:
            self._queued -= len(self._queue[trial, kind])
            self._queue[trial, kind] = {}
        self._dirty.add(trial)

    def refresh_estimates(self, trials: Iterable[str] | None = None) -> None:
        """Read the rule's estimates of ``trials`` (default: all) again at the next assign.

        Needed only by an indexed rule (:meth:`WorkAwareRule.per_trial`) whose estimate
        of a trial changed while its queue did not (a trial's estimates are read again
        whenever one of its units starts, completes or fails).

        Raises:
            ConfigError: A trial is unknown.
        """
        for trial in self._trials if trials is None else trials:
            self._dirty.add(self._check_trial(trial, "refresh_estimates"))

    def set_group_size(self, trial: str, size: int) -> None:
        """Set ``trial``'s group size from its next group on (a running group runs on).

        It replaces the trial's plan, if it had one; e.g. ``1`` when the backend cannot
        run group units.

        Raises:
            ConfigError: ``trial`` is unknown or ``size`` is not an integer ``>= 1``.
        """
        self._check_trial(trial, "set_group_size")
        self._sizes[trial] = _group_size(trial, size)
        self._plan_ends.pop(trial, None)
        self._grouping = self._group_trials()
        self._grouped = frozenset(self._grouping)
        if self._grouping:
            self._offers = None  # group units: every decision lists the candidates

    def set_pack_key(self, trial: str, key: str | None) -> None:
        """Set ``trial``'s pack key from its next unit on (a running pack runs on).

        ``None`` takes the trial out of future packs, e.g. when the kernel cannot stack
        its model, or when its procedure paused it; a key puts it in the packs of that
        key (see "Packs" in the class docstring).

        Raises:
            ConfigError: ``trial`` is unknown or ``key`` is not a non-empty string.
        """
        self._check_trial(trial, "set_pack_key")
        if key is None:
            self._keys.pop(trial, None)
            return
        self._keys[trial] = _pack_key(trial, key)
        if self._packing():
            self._offers = None  # packs: every decision lists the candidates

    # ---------------------------------------------------------------- elasticity

    def add_worker(self, worker: str, partitions: Collection[int]) -> None:
        """Register a new live worker holding ``partitions`` (§5.6 scale-out).

        Raises:
            ConfigError: ``worker`` is already live, or holds an unknown partition.
        """
        if worker in self._held:
            raise ConfigError(f"worker {worker!r} is already registered")
        self._held[worker] = self._check_held(worker, partitions)
        self._held_order[worker] = tuple(sorted(self._held[worker]))
        self._worker_order = None

    def remove_worker(self, worker: str) -> Unit | None:
        """Forget a worker that left or died; its running work moves back to Q (§5.6).

        If it was a member of a group assignment, the whole group goes back to Q and the
        other members are idle again. If it ran a pack, every member still running goes
        back to Q.

        Returns:
            The unit it was running (its own rank's unit of a group, the first member
            of a pack still running), if any.

        Raises:
            ConfigError: ``worker`` is not live.
        """
        self._check_worker(worker)
        assignment = self._running.get(worker)
        back: Unit | None = None
        if assignment is not None:
            back = assignment.unit_of(worker)
            if assignment.packed:
                running = [u for u in assignment.pack if self._busy.get(u.trial) is assignment]
                back = running[0]
                for unit in running:
                    self.fail(unit)
            else:
                self.fail(assignment.unit)
        del self._held[worker]
        del self._held_order[worker]
        self._worker_order = None
        return back

    def set_partitions(self, worker: str, partitions: Collection[int]) -> None:
        """Re-home: ``worker`` now holds ``partitions``. A running unit runs on.

        Raises:
            ConfigError: ``worker`` is not live, or a partition is unknown.
        """
        self._check_worker(worker)
        self._held[worker] = self._check_held(worker, partitions)
        self._held_order[worker] = tuple(sorted(self._held[worker]))

    # ---------------------------------------------------------------- the index

    def _indexable(self) -> bool:
        """Whether decisions can come from the index (see *Cost* in the class docstring).

        Exact rule types only: a subclass may choose differently. Ascending partitions
        make the candidates' order within a trial the partition order either way.
        """
        rule = self._rule
        indexed = type(rule) is RandomizedRule or (type(rule) is WorkAwareRule and rule.indexable)
        return (
            indexed
            and not self._grouping
            and not self._packing()
            and list(self._partitions) == sorted(self._partitions)
            and list(self._val_partitions) == sorted(self._val_partitions)
        )

    def _assign_indexed(self, offers: Offers) -> list[Assignment]:
        """:meth:`assign` without groups, each decision drawn from the index."""
        rule = self._rule
        assert type(rule) is RandomizedRule or type(rule) is WorkAwareRule  # ok: _indexable
        for trial in self._dirty:
            position = self._positions[trial]
            offers.drop(position)
            train = self._queue[trial, UnitKind.TRAIN]
            validate = self._queue[trial, UnitKind.VALIDATE]
            if trial in self._busy or not (train or validate):
                continue
            if train:
                partitions = (next(iter(train)),) if self._ordered else tuple(train)
            else:
                partitions = tuple(validate)
            offers.put(position, rule.trial_key(trial, len(train), len(validate)), partitions)
        self._dirty.clear()
        made: list[Assignment] = []
        for worker in self._workers_sorted():
            if worker in self._running:
                continue
            picked = offers.pick(self._held_order[worker], self._rng)
            if picked is None:
                continue
            position, partition = picked
            trial = self._trials[position]
            queue = self._queue[trial, UnitKind.TRAIN] or self._queue[trial, UnitKind.VALIDATE]
            made.append(self._start(worker, queue[partition]))
        return made

    def _workers_sorted(self) -> list[str]:
        if self._worker_order is None:
            self._worker_order = sorted(self._held)
        return self._worker_order

    def _packing(self) -> bool:
        """Whether packs may form (a pack size above 1 and a trial with a key)."""
        return self._pack_size > 1 and bool(self._keys)

    def _group_trials(self) -> tuple[str, ...]:
        """Trials whose train units may form groups (group size or plan), in trial order."""
        return tuple(t for t in self._trials if self._sizes[t] > 1 or t in self._plan_ends)

    # ---------------------------------------------------------------- internals

    def _canonical(self, trial: str, kind: UnitKind) -> tuple[int, ...]:
        return self._orders[trial] if kind is UnitKind.TRAIN else self._val_partitions

    def _candidates(
        self, worker: str, groups: Mapping[str, _Group], excluded: Collection[str | None]
    ) -> list[Unit]:
        """Units of idle trials that ``worker`` may run (Alg. 1 line 10, §5.5, §5.7)."""
        held = self._held[worker]
        in_order = sorted(held)
        found: list[Unit] = []
        for trial in self._trials:
            if trial in self._busy or trial in excluded:
                continue
            train = self._queue[trial, UnitKind.TRAIN]
            queue = train or self._queue[trial, UnitKind.VALIDATE]
            if not queue:
                continue
            group = groups.get(trial) if queue is train else None
            if group is not None and group[1] >= 2:
                found.extend(train[p] for p in group[0] if p in held)
            elif self._ordered and queue is train:
                first = next(iter(train.values()))
                if first.partition in held:
                    found.append(first)
            elif len(held) < len(queue):
                found.extend(queue[p] for p in in_order if p in queue)
            else:
                found.extend(unit for p, unit in queue.items() if p in held)
        return found

    def _limit(self, trial: str) -> int:
        """Most train units the idle ``trial``'s next group may cover (``L``)."""
        left = len(self._queue[trial, UnitKind.TRAIN])
        ends = self._plan_ends.get(trial)
        if ends is None:
            return min(self._sizes[trial], left)
        done = self._steps[trial, UnitKind.TRAIN]
        end = next((e for e in ends if e > done), done + 1)
        return min(end - done, left)

    def _next_groups(self) -> dict[str, _Group]:
        """The next group of every idle trial whose next train units may be grouped.

        Each is ``(partitions the group draws from, its size s)``: with visit orders the
        group's partitions themselves, by rank; without, every remaining train partition.
        """
        groups: dict[str, _Group] = {}
        workers = self._workers_sorted()
        for trial in self._grouping:
            train = self._queue[trial, UnitKind.TRAIN]
            if trial in self._busy or not train:
                continue
            limit = self._limit(trial)
            if limit < 2:
                continue
            matcher: Matcher[int, str] = Matcher(
                lambda p: [w for w in workers if p in self._held[w]]
            )
            if self._ordered:
                prefix = list(itertools.takewhile(matcher.add, list(train)[:limit]))
                groups[trial] = (tuple(prefix), len(prefix))
            else:
                size = 0
                for partition in train:
                    size += matcher.add(partition)
                    if size == limit:
                        break
                groups[trial] = (tuple(train), size)
        return groups

    def _gather(
        self, group: _Group, first: Sequence[str], rest: Sequence[str]
    ) -> tuple[list[str], Matcher[str, int]]:
        """Pick up to ``s`` workers, ``first`` then ``rest``, matchable to the partitions.

        Greedy on the (transversal) matroid of worker sets that can be matched to distinct
        partitions of the group: a worker joins if the matching grows.
        """
        partitions, size = group
        matcher: Matcher[str, int] = Matcher(
            lambda w: [p for p in partitions if p in self._held[w]]
        )
        chosen: list[str] = []
        for worker in itertools.chain(first, rest):
            if len(chosen) == size:
                break
            if worker not in chosen and matcher.add(worker):
                chosen.append(worker)
        return chosen, matcher

    def _serve_waiting(
        self, idle: Sequence[str], groups: Mapping[str, _Group], taken: set[str]
    ) -> Assignment | None:
        """Start the waiting group if the idle workers can complete it."""
        trial = self._waiting
        assert trial is not None  # ok: only called with a waiting group
        group = groups.get(trial)
        if group is None or group[1] < 2:  # the map changed: it no longer needs a group
            self._waiting = None
            return None
        chosen, matcher = self._gather(group, (), idle)
        if len(chosen) < group[1]:
            return None
        self._waiting = None
        taken.update(chosen)
        return self._start_group(trial, chosen, matcher)

    def _start(self, worker: str, unit: Unit) -> Assignment:
        del self._queue[unit.trial, unit.kind][unit.partition]
        self._queued -= 1
        if self._offers is not None:
            self._offers.drop(self._positions[unit.trial])
        assignment = Assignment(unit, worker, self._steps[unit.trial, unit.kind])
        self._running[worker] = assignment
        self._busy[unit.trial] = assignment
        return assignment

    def _mates(self, worker: str, unit: Unit) -> list[Unit]:
        """The units that join ``unit``'s pack on ``worker`` (see "Packs" above).

        Mates are chosen before anything starts: the rule sees Q as it was when it picked
        ``unit``. Returned in trial order.
        """
        trial = unit.trial
        key = self._keys.get(trial)
        if key is None or self._pack_size < 2 or unit.kind is not UnitKind.TRAIN:
            return []
        if trial in self._grouped:
            return []
        partition = unit.partition
        candidates: list[Unit] = []
        for other in self._trials:
            if other == trial or self._keys.get(other) != key:
                continue
            if other in self._busy or other in self._grouped:
                continue
            train = self._queue[other, UnitKind.TRAIN]
            if partition not in train:
                continue
            if self._ordered and next(iter(train)) != partition:
                continue
            candidates.append(train[partition])
        slots = self._pack_size - 1
        if len(candidates) <= slots:
            return candidates
        view = _QueueView(self._trials, self._queue)
        left = list(candidates)
        chosen: set[Unit] = set()
        while len(chosen) < slots:
            pick = self._rule.choose(worker, left, view, self._rng)
            if pick not in left:
                raise ConfigError(
                    f"rule {self._rule!r} chose {pick!r} as a pack mate for worker "
                    f"{worker!r}, which is not one of the candidates {left!r}"
                )
            chosen.add(pick)
            left.remove(pick)
        return [u for u in candidates if u in chosen]

    def _start_pack(self, worker: str, unit: Unit, mates: Sequence[Unit]) -> Assignment:
        """Start ``unit`` with its pack ``mates`` on ``worker`` (no mates: ordinary)."""
        if not mates:
            return self._start(worker, unit)
        pack = (unit, *mates)
        for member in pack:
            del self._queue[member.trial, member.kind][member.partition]
        self._queued -= len(pack)
        assignment = Assignment(
            unit,
            worker,
            self._steps[unit.trial, unit.kind],
            packed=tuple(mates),
            steps=tuple(self._steps[u.trial, u.kind] for u in pack),
        )
        self._running[worker] = assignment
        for member in pack:
            self._busy[member.trial] = assignment
        return assignment

    def _start_group(
        self, trial: str, workers: Sequence[str], matcher: Matcher[str, int]
    ) -> Assignment:
        train = self._queue[trial, UnitKind.TRAIN]
        rank = {p: i for i, p in enumerate(train)}  # queue order: visit or partition order
        pairs = sorted(((matcher.left[w], w) for w in workers), key=lambda pw: rank[pw[0]])
        for partition, _ in pairs:
            del train[partition]
        self._queued -= len(pairs)
        assignment = Assignment(
            Unit(trial, pairs[0][0]),
            pairs[0][1],
            self._steps[trial, UnitKind.TRAIN],
            workers=tuple(w for _, w in pairs),
            partitions=tuple(p for p, _ in pairs),
        )
        for worker in assignment.workers:
            self._running[worker] = assignment
        self._busy[trial] = assignment
        return assignment

    def _release(self, unit: Unit, worker: str | None, verb: str) -> tuple[Unit, ...]:
        """Take ``unit``'s trial out of its running assignment; return the trial's units.

        Those are a group's units, or ``unit`` alone (an ordinary assignment or a pack's
        member).
        """
        assignment = self._busy.get(unit.trial)
        if assignment is None or not _member(assignment, unit):
            raise ConfigError(f"cannot {verb} {unit!r}: it is not running")
        if worker is not None and worker not in assignment.workers:
            runs_on = " and ".join(repr(w) for w in assignment.workers)
            raise ConfigError(
                f"cannot {verb} {unit!r} for worker {worker!r}: it runs on worker {runs_on}"
            )
        del self._busy[unit.trial]
        self._unrun(assignment)
        return (unit,) if assignment.packed else assignment.units

    def _unrun(self, assignment: Assignment) -> None:
        """Take ``assignment`` off the workers still running it (not those it freed).

        A pack stays on its worker while a member still runs.
        """
        busy = self._busy
        if any(busy.get(trial) is assignment for trial in assignment.trials):
            return
        for member in assignment.workers:
            if self._running.get(member) is assignment:
                del self._running[member]

    def _requeue(self, units: Sequence[Unit]) -> None:
        first = units[0]
        queue = self._queue[first.trial, first.kind]
        back = {unit.partition: unit for unit in units}
        self._queued += len(back)
        self._queue[first.trial, first.kind] = {
            p: queue[p] if p in queue else back[p]
            for p in self._canonical(first.trial, first.kind)
            if p in queue or p in back
        }

    def _check_trial(self, trial: str, what: str | None = None) -> str:
        if trial not in self._orders:
            where = "unknown trial" if what is None else f"{what} names unknown trial"
            raise ConfigError(f"{where} {trial!r}; trials of this epoch: {list(self._trials)}")
        return trial

    def _check_worker(self, worker: str) -> None:
        if worker not in self._held:
            raise ConfigError(f"unknown worker {worker!r}; live workers: {sorted(self._held)}")

    def _check_held(self, worker: str, partitions: Collection[int]) -> frozenset[int]:
        held = frozenset(_ints(f"partitions of worker {worker!r}", partitions))
        unknown = sorted(held - self._known)
        if unknown:
            raise ConfigError(
                f"worker {worker!r} holds unknown partitions {unknown}; known partitions: "
                f"{sorted(self._known)}"
            )
        return held

    def _take_completed(self, unit: Unit) -> None:
        if unit.trial not in self._orders:
            raise ConfigError(f"completed unit {unit!r} has an unknown trial {unit.trial!r}")
        queue = self._queue[unit.trial, unit.kind]
        if unit.partition not in self._canonical(unit.trial, unit.kind):
            raise ConfigError(
                f"completed unit {unit!r} has partition {unit.partition!r}, which is not a "
                f"{unit.kind.value} partition of this epoch"
            )
        if unit.partition not in queue:
            raise ConfigError(f"completed unit {unit!r} appears twice in completed")
        del queue[unit.partition]
        self._steps[unit.trial, unit.kind] += 1

    def _check_resume_state(self) -> None:
        for trial in self._trials:
            train = self._queue[trial, UnitKind.TRAIN]
            done = self._steps[trial, UnitKind.TRAIN]
            if self._ordered and tuple(train) != self._orders[trial][done:]:
                raise ConfigError(
                    f"completed train units of trial {trial!r} are not the first {done} "
                    f"partitions of its visit order {list(self._orders[trial])!r}"
                )
            if train and self._steps[trial, UnitKind.VALIDATE]:
                raise ConfigError(
                    f"completed has validate units of trial {trial!r} but its train "
                    f"partitions {list(train)} are not complete"
                )


class _QueueView(Mapping[str, Sequence[Unit]]):
    """Read-only view of Q by trial, train units before validate units."""

    def __init__(
        self, trials: Sequence[str], queue: Mapping[tuple[str, UnitKind], Mapping[int, Unit]]
    ) -> None:
        self._trials = trials
        self._queue = queue

    def __getitem__(self, trial: str) -> tuple[Unit, ...]:
        return (
            *self._queue[trial, UnitKind.TRAIN].values(),
            *self._queue[trial, UnitKind.VALIDATE].values(),
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._trials)

    def __len__(self) -> int:
        return len(self._trials)


def _ints(name: str, values: Iterable[int]) -> tuple[int, ...]:
    """Convert to Python ints, refusing anything that is not an integer."""
    values = list(values)
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise ConfigError(f"{name} {values!r} must be integers") from None


def _indices(name: str, values: Sequence[int]) -> tuple[int, ...]:
    """Validate a non-empty sequence of unique non-negative partition indices."""
    indices = _ints(name, values)
    if not indices or len(set(indices)) != len(indices) or min(indices) < 0:
        raise ConfigError(
            f"{name} {list(indices)!r} must be non-empty, unique and non-negative integers"
        )
    return indices


def _check_orders(
    visit_orders: Mapping[str, Sequence[int]], trials: Sequence[str], partitions: Sequence[int]
) -> dict[str, tuple[int, ...]]:
    """Validate visit orders: one per trial, each a permutation of ``partitions``."""
    extra = sorted(set(visit_orders) - set(trials))
    missing = [t for t in trials if t not in visit_orders]
    if extra or missing:
        raise ConfigError(
            f"visit_orders must have exactly one order per trial; missing {missing}, "
            f"unknown {extra}"
        )
    orders = {}
    for trial in trials:
        order = _ints(f"visit_orders[{trial!r}]", visit_orders[trial])
        if sorted(order) != sorted(partitions):
            raise ConfigError(
                f"visit_orders[{trial!r}] = {list(order)!r} is not a permutation of the "
                f"partitions {list(partitions)!r}"
            )
        orders[trial] = order
    return orders


def _group_size(trial: str, size: int) -> int:
    """Validate a group size: an integer ``>= 1``."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ConfigError(f"group size of trial {trial!r} must be an integer >= 1, got {size!r}")
    return int(size)


def _member(assignment: Assignment, unit: Unit) -> bool:
    """Whether ``unit`` is one of ``assignment``'s: a group rank's or a pack member's."""
    return unit in assignment.units or unit in assignment.packed


def _pack_size(size: int) -> int:
    """Validate a pack size: an integer ``>= 1``."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ConfigError(f"pack_size must be an integer >= 1 (1: packing off), got {size!r}")
    return int(size)


def _pack_key(trial: str, key: str) -> str:
    """Validate a pack key: a non-empty string."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"pack key of trial {trial!r} must be a non-empty string, got {key!r}")
    return key


def _plan_ends(trial: str, plan: Sequence[int], num_partitions: int) -> tuple[int, ...]:
    """Validate a group plan; return the positions where its groups end."""
    sizes = _ints(f"group_plans[{trial!r}]", plan)
    if not sizes or min(sizes) < 1 or sum(sizes) != num_partitions:
        raise ConfigError(
            f"group_plans[{trial!r}] = {list(sizes)!r} must be positive group sizes summing "
            f"to the number of partitions {num_partitions}"
        )
    return tuple(itertools.accumulate(sizes))
