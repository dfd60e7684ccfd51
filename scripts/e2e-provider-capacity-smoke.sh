#!/usr/bin/env bash
# End-to-end capacity smoke: an Edge, a Node and a loopback OpenAI-compatible upstream;
# two model aliases share one capacity-1 provider. N concurrent requests across both
# aliases must all complete, the upstream must never see more than one at a time, and
# afterwards every pool counter must be 0 and the queue empty. Exit 0 when all hold.
#
#   scripts/e2e-provider-capacity-smoke.sh [--requests N] [--stall SECONDS]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
if [ ! -x "$PY" ]; then
    echo "no Python at $PY: run 'make test' once to set up .venv, or set PYTHON" >&2
    exit 2
fi
cd "$ROOT"
exec env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" scripts/smoke_capacity.py "$@"
