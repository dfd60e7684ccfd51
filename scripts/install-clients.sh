#!/usr/bin/env bash
# The coding agents the test suite runs against the Edge (R-CLIENT-1, docs/journeys.md):
# Claude Code and the Codex CLI at the versions pinned in tests/clients/package-lock.json,
# installed once into var/clients (a stamp names the lock's hash, so a new pin reinstalls).
# Without node and npm, or when the registry cannot be reached, nothing is installed: the
# tests that need them skip and `make test`'s last line says why (scripts/test_services.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "node/npm not found: the coding-agent CLI tests will skip" >&2
    exit 1
fi
lock=tests/clients/package-lock.json
stamp="var/clients/.installed-$(sha256sum "$lock" | cut -c1-16)"
[ -e "$stamp" ] && exit 0
rm -rf var/clients
mkdir -p var/clients
cp tests/clients/package.json "$lock" var/clients/
# Both packages ship their native binary in a platform package. Install scripts are off; the
# one script needed is run by name: Claude Code's, which links its platform binary.
(
    cd var/clients
    timeout 600 npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
    node node_modules/@anthropic-ai/claude-code/install.cjs
)
touch "$stamp"
