"""The provider pool: leases, one global waiter queue, node readiness (R-POOL-1..9, R-REF-3).

Plain asyncio; imports nothing from Django or the rest of the project.
"""

from .core import PoolCore, WaiterSink
from .errors import NotAdmitted, PoolError, QueueFull, QueueTimeout, Unavailable, UnknownModel
from .model import Lease, PoolPolicy, PoolProvider, PoolSnapshot, ProviderStatus
from .pool import ProviderPool
from .state import Waiter

__all__ = [
    "Lease",
    "NotAdmitted",
    "PoolCore",
    "PoolError",
    "PoolPolicy",
    "PoolProvider",
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
