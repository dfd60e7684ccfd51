"""Why a ``RedisPool`` cannot hold this Edge's id (docs/scale-out.md, "Fencing")."""


class EdgeIdInUse(RuntimeError):
    """Another live Edge holds this Edge id (its ``{P}:alive:{id}`` key)."""


class EdgeFenced(RuntimeError):
    """Another process took this Edge's id over (a newer fence, R-SCALE-4): this one may not
    hold or serve capacity any more."""
