"""The pool app's models: the usage ledger, defined with the meter that writes it."""

from pool.metering.models import RequestLogEntry, UsageBucket

__all__ = ["RequestLogEntry", "UsageBucket"]
