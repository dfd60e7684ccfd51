"""Run a fake upstream as its own process: ``python -m tests.fakes.upstream --kind openai``.

Prints the listening port on its first stdout line, then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from tests.fakes.base import FakeServer
from tests.fakes.ollama_server import FakeOllama
from tests.fakes.openai_server import FakeOpenAI

KINDS: dict[str, type[FakeServer]] = {"openai": FakeOpenAI, "ollama": FakeOllama}


async def serve(args: argparse.Namespace) -> None:
    server = KINDS[args.kind]()
    server.faults.status = args.fail_status
    server.faults.delay = args.delay
    server.faults.stall_before_first_byte = args.stall_first
    await server.start(args.port)
    print(server.port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=sorted(KINDS), default="openai")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fail-status", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--stall-first", type=float, default=None, help="seconds before answering")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
