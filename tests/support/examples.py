"""How many examples a property-based test draws: every one in `make test`, about a tenth in
`make test-fast` (which sets ``IOP_TEST_FAST=1``; docs/testing.md). The inner loop still runs
each property, on fewer cases; `make test` and CI run them all."""

from __future__ import annotations

import os

FAST = os.environ.get("IOP_TEST_FAST") == "1"
# A CPU-bound property test on a busy 2-core machine (several test processes at once): its
# time limit, in place of pytest-timeout's default 120 s, which is a hang guard.
SLOW_PROPERTY_TIMEOUT_S = 600


def examples(full: int) -> int:
    """``full`` in `make test`; a tenth of it (at least 5) in `make test-fast`."""
    return max(5, full // 10) if FAST else full
