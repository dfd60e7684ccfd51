"""The provider pool shared by several Edges through Redis (R-SCALE-2/3, docs/pool.md).

Same rules as ``pool.engine`` (the in-memory reference, R-POOL-1..9, R-HEALTH-1..3), decided
by atomic Lua scripts on Redis time. Imports nothing from Django or the rest of the project
but ``pool.engine``'s types.
"""

from .pool import RedisPool
from .pool_errors import EdgeFenced, EdgeIdInUse

__all__ = ["EdgeFenced", "EdgeIdInUse", "RedisPool"]
