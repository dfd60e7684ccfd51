"""``iop-node --config node.yaml``: run a Node until SIGTERM/SIGINT, then exit 0.
``iop-node keygen --out DIR``: make the Node's recipient key pair (nodes.agent.keygen).

The Node's modules load with the collector held (nodes.heap): what the start builds lives as
long as the Node. ``nodes.agent.cli`` settles the heap and turns the collector on before the
Node dials its Edge."""

from __future__ import annotations

import sys

from nodes.heap import collector_paused


def main(argv: list[str] | None = None) -> int:
    with collector_paused():
        from nodes.agent.cli import main as run

        return run(argv)


if __name__ == "__main__":
    sys.exit(main())
