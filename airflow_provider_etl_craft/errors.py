"""Typed errors: one class per status of docs/errors.md, each knowing its CLI exit code and whether Airflow may retry."""

from __future__ import annotations


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of ``exc``'s message (a driver's error may span several), or ``default`` (the exception's
    class name) when it has none: what the provider's messages quote of an error they wrap."""
    return (str(exc).strip().splitlines() or [default or type(exc).__name__])[0]


class EtlCraftError(Exception):
    """Base of every expected error; ``exit_code`` is the CLI status, ``retryable`` the Airflow outcome."""

    exit_code: int = 1
    status_name: str = "FAILURE"
    retryable: bool = True
    #: A short stable name of the situation where the class alone does not say it (the failover cases of
    #: docs/failover-errors.md, e.g. ``peer_closed``), for operators' logs and for tests; None otherwise.
    case: str | None = None


class TaskFailedError(EtlCraftError):
    """A task or run failed; Airflow may retry it."""


class ConfigurationError(EtlCraftError):
    """Missing or invalid file or setting, unset secret, bad URL or auth mode, missing schema, …"""

    exit_code = 3
    status_name = "CONFIGURATION"
    retryable = False


class EngineUnreachableError(ConfigurationError):
    """The Engine DB did not answer, or not as a primary (a failover under way); a retry may succeed once it is
    back. ``case`` names which of the cases of docs/failover-errors.md it was.

    ``in_doubt``: the session was lost under a write's COMMIT, so the write may have been committed; a retried
    step recognises its own write (docs/high-availability.md, "In-doubt commits").
    """

    retryable = True

    def __init__(self, message: str, *, case: str | None = None, in_doubt: bool = False) -> None:
        super().__init__(message)
        if case is not None:
            self.case = case
        self.in_doubt = in_doubt


class MetadataError(EtlCraftError):
    """A pipeline or task code is not active in the CFG_ tables."""

    exit_code = 4
    status_name = "METADATA"
    retryable = False


class GraphError(EtlCraftError):
    """The pipeline's dependency graph cannot run: a run condition no set of dependencies can meet, an
    unknown dependency type or run condition (docs/graph-validation.md)."""

    exit_code = 5
    status_name = "GRAPH"
    retryable = False


class SelfDependencyError(GraphError):
    """A task depends on itself."""

    exit_code = 6
    status_name = "SELF_DEPENDENCY"


class DependencyCycleError(GraphError):
    """Task dependencies, or pipeline dependencies, form a cycle, so none of its members can start."""

    exit_code = 7
    status_name = "DEPENDENCY_CYCLE"


class UnknownTaskError(GraphError):
    """A dependency names a task outside the pipeline it says, or no task at all."""

    exit_code = 8
    status_name = "UNKNOWN_TASK"


class RunStateError(EtlCraftError):
    """No run with this key to bind to."""

    exit_code = 9
    status_name = "RUN_STATE"
    retryable = False


class EngineDBError(EtlCraftError):
    """init-db found a partial or foreign Engine schema."""

    exit_code = 12
    status_name = "ENGINE_DB"
    retryable = False


class MigrationError(EtlCraftError):
    """An applied migration was edited or removed, or a migration file failed."""

    exit_code = 13
    status_name = "MIGRATION"
    retryable = False


class LockTimeoutError(EtlCraftError):
    """A named Engine DB lock was not acquired in time."""

    exit_code = 14
    status_name = "LOCK_TIMEOUT"
    retryable = True


class StaleTransitionError(EtlCraftError):
    """Another attempt or owner changed the row first."""

    exit_code = 20
    status_name = "STALE_TRANSITION"
    retryable = True
