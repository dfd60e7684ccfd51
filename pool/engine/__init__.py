"""The provider pool: leases, one global waiter queue, node readiness, provider health
(R-POOL-1..9, R-REF-3, R-HEALTH-1..3).

Plain asyncio; imports nothing from Django or the rest of the project.
"""

from .core import PoolCore, WaiterSink
from .errors import (
    NotAdmitted,
    PoolBackendUnavailable,
    PoolError,
    PoolRecovering,
    QueueFull,
    QueueTimeout,
    Unavailable,
    UnknownModel,
)
from .interface import PoolEngine
from .model import HealthPolicy, Lease, PoolPolicy, PoolProvider, PoolSnapshot, ProviderStatus
from .pool import ProviderPool
from .state import Waiter

__all__ = [
    "HealthPolicy",
    "Lease",
    "NotAdmitted",
    "PoolBackendUnavailable",
    "PoolCore",
    "PoolEngine",
    "PoolError",
    "PoolPolicy",
    "PoolProvider",
    "PoolRecovering",
    "PoolSnapshot",
    "ProviderPool",
    "ProviderStatus",
    "QueueFull",
    "QueueTimeout",
    "Unavailable",
    "UnknownModel",
    "Waiter",
    "WaiterSink",
]
