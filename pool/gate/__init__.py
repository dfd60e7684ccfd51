"""The Stream Evidence Gate: filters on streamed output text (R-SEG-5..8).

The rule is written in docs/stream-evidence-gate.md.

Pure and synchronous: each filter is fed text and says what may be released. The relay
path owns the I/O and the recovery; nothing here imports Django or the rest of the project.
"""

from .pipeline import FilterPipeline, FilterSpec, GateVerdict
from .repeat_guard import RepeatGuard, find_repeat

__all__ = ["FilterPipeline", "FilterSpec", "GateVerdict", "RepeatGuard", "find_repeat"]
