"""The ClusterManager seam: how many executors the search runs on, and which.

The elastic layer (``shared/design.md``, "Elastic layer") resizes the cluster between the
stages of a search through a :class:`ClusterManager`. A manager knows one thing the rest
of cerebro-spark does not: how executors come and go on its platform (Spark's own
executor requests, worker daemons on this machine, a Databricks cluster, EC2 instances).
Workers are not its business: the worker pool starts a worker on every executor that
appears (``Transport.arrivals``) and retires workers before their executors are released.

Rules every manager keeps:

* :meth:`ClusterManager.executors` is a snapshot of the executors that serve the
  application now: registered, not killed, not being released. Each has an id (Spark's
  executor id), a host, cores, GPUs and ``since``, when its *instance* was requested (the
  moment billing starts), and ``instance``, what a provider bills (an EC2 instance, a
  worker daemon, a cluster node; the executor itself when nothing else is known).
* :meth:`ClusterManager.resize` returns at once. It asks for ``target`` executors; when
  shrinking, the executors named in ``victims`` go first (managers that cannot choose say
  so in :attr:`Capabilities.choose_victims` and refuse victims). Shrinking releases
  executors; callers make sure nothing runs on a victim first (a retired worker), because
  a platform may kill it at once. Growing never releases anything.
* :meth:`ClusterManager.wait` blocks until exactly ``target`` executors serve, or raises
  :class:`ResizeTimeout` with the numbers.
* :attr:`ClusterManager.capabilities` says what it can do: resize at all (``local[N]`` is
  fixed), choose victims, the least and most executors, the instance type it runs, and
  whether the pool sees the executors a grow adds (not under Spark Connect).
* :meth:`ClusterManager.close` releases what this manager started and nothing else (an
  existing cluster keeps running); it is idempotent.

A test fake fits in ten lines::

    class FakeCluster(ClusterManager):
        capabilities = Capabilities(resizable=True, choose_victims=True)

        def __init__(self, n: int) -> None:
            self.live = [Executor(str(i), "h", 1) for i in range(n)]

        def executors(self) -> list[Executor]:
            return list(self.live)

        def resize(self, target: int, victims: Sequence[str] = ()) -> None:
            kept = [e for e in self.live if e.executor_id not in victims][:target]
            self.live = kept + [Executor(f"n{i}", "h", 1) for i in range(target - len(kept))]
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Sequence

from cerebro_spark.errors import CerebroError, ConfigError


@dataclasses.dataclass(frozen=True)
class Executor:
    """One executor serving the application.

    Attributes:
        executor_id: Spark's executor id.
        host: Where it runs.
        cores: Its cores.
        gpus: Its GPUs.
        since: Unix time its instance was requested (billing starts), or when it was first
            seen where the request is not known.
        instance: What the provider bills (instance, node, worker daemon); ``None``: the
            executor itself.
    """

    executor_id: str
    host: str
    cores: int
    gpus: int = 0
    since: float = 0.0
    instance: str | None = None

    @property
    def billed_as(self) -> str:
        """The key billing is counted under (the instance, else the executor)."""
        return self.instance if self.instance is not None else f"executor-{self.executor_id}"


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a manager can do.

    Attributes:
        resizable: Whether :meth:`ClusterManager.resize` can change anything (``local[N]``
            cannot).
        choose_victims: Whether a shrink can name the executors to release.
        min_executors: Fewest executors it allows.
        max_executors: Most executors it allows (``None``: no limit it knows of).
        instance_type: The instance type its executors run on, when it knows.
        workers_follow: Whether the backend starts workers on the executors a grow adds
            by itself (classic Spark: the pool sees them arrive). ``False`` where nothing
            tells the pool (Spark Connect): the controller waits for the executors and
            starts their workers (``Backend.add_worker``).
    """

    resizable: bool
    choose_victims: bool
    min_executors: int = 0
    max_executors: int | None = None
    instance_type: str | None = None
    workers_follow: bool = True


class ResizeTimeout(CerebroError, TimeoutError):
    """The cluster did not reach its target in time.

    Attributes:
        target: Executors asked for.
        live: Executors serving when the wait gave up.
        seconds: How long it waited.
    """

    def __init__(self, target: int, live: int, seconds: float, detail: str = "") -> None:
        super().__init__(
            f"the cluster did not reach {target} executors within {seconds:.0f} s: "
            f"{live} serve" + (f" ({detail})" if detail else "")
        )
        self.target = target
        self.live = live
        self.seconds = seconds


class ClusterManager(abc.ABC):
    """Resizes the executors a search runs on (rules in the module docstring)."""

    #: What the manager can do.
    capabilities: Capabilities

    @abc.abstractmethod
    def executors(self) -> list[Executor]:
        """Return the executors serving the application now."""

    @abc.abstractmethod
    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Ask for ``target`` executors; when shrinking, release ``victims`` first.

        Returns at once; :meth:`wait` waits for the result.

        Raises:
            ConfigError: ``target`` is outside the manager's bounds, or victims were
                named where they cannot be chosen.
        """

    def wait(self, target: int, timeout_s: float, poll_s: float = 0.5) -> list[Executor]:
        """Wait until exactly ``target`` executors serve; return them.

        Raises:
            ResizeTimeout: They did not within ``timeout_s`` seconds.
        """
        begun = time.monotonic()
        while True:
            live = self.executors()
            if len(live) == target:
                return live
            waited = time.monotonic() - begun
            if waited >= timeout_s:
                raise ResizeTimeout(target, len(live), waited)
            time.sleep(min(poll_s, max(0.0, timeout_s - waited)))

    def close(self) -> None:  # noqa: B027 (optional: a manager may have nothing to release)
        """Release what this manager started (idempotent)."""

    def failed_tasks(self) -> int | None:
        """Tasks the application's scheduler reports failed so far (``None``: not known).

        A resize done right fails none: victims are drained before they are released.
        """
        return None

    def check_resize(self, target: int, victims: Sequence[str]) -> None:
        """Check a resize against :attr:`capabilities` (for implementations).

        Raises:
            ConfigError: The rule it breaks is named.
        """
        caps = self.capabilities
        name = type(self).__name__
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise ConfigError(f"{name}: target must be an integer >= 0 executors, got {target!r}")
        if not caps.resizable and target != len(self.executors()):
            raise ConfigError(
                f"{name} is a fixed cluster of {len(self.executors())} executors: it cannot "
                f"be resized to {target}"
            )
        if target < caps.min_executors or (
            caps.max_executors is not None and target > caps.max_executors
        ):
            raise ConfigError(
                f"{name}: target {target} is outside its bounds [{caps.min_executors}, "
                f"{caps.max_executors if caps.max_executors is not None else 'no limit'}]"
            )
        if victims and not caps.choose_victims:
            raise ConfigError(
                f"{name} cannot choose which executors to release; got victims {list(victims)}"
            )
