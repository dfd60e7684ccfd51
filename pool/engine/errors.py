"""Typed pool errors; each ``code`` maps to one HTTP answer at the edge of the HTTP surface."""

from __future__ import annotations


class PoolError(Exception):
    """Base of every admission failure; ``code`` is the stable machine-readable reason."""

    code: str = "pool_error"
    default_message: str = "the provider pool refused the request"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.default_message)


class QueueFull(PoolError):
    """The root queue already holds ``max_queue`` waiters (R-POOL-4)."""

    code = "queue_full"
    default_message = "the provider queue is full"


class QueueTimeout(PoolError):
    """The request waited ``queue_timeout_ms`` without a free provider (R-POOL-4)."""

    code = "queue_timeout"
    default_message = "timed out waiting for a free provider"


class Unavailable(PoolError):
    """No live candidate: at arrival, or every live candidate vanished while waiting (R-POOL-6)."""

    code = "no_available_provider"
    default_message = "no provider is available for this model"


class NotAdmitted(PoolError):
    """No provider of the model group declares the capabilities the operation needs (R-PROF-4)."""

    code = "unsupported_operation"
    default_message = "no provider of this model supports the requested operation"


class UnknownModel(PoolError):
    """The model is not a configured model group (R-CFG-1)."""

    code = "model_not_found"
    default_message = "the requested model does not exist"


class PoolBackendUnavailable(PoolError):
    """The shared pool store (Redis, several Edges) cannot be reached (docs/pool.md)."""

    code = "pool_unavailable"
    default_message = "the shared provider pool is unreachable; retry shortly"


class PoolRecovering(PoolError):
    """The shared pool store lost its data; admissions wait until every live Edge re-asserted
    its leases and Nodes, so capacity is never over-admitted (docs/pool.md)."""

    code = "pool_recovering"
    default_message = "the shared provider pool is recovering; retry shortly"
