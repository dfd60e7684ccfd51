"""The benchmark's one-hop baseline: plain ASGI under daphne, forwarding with aiohttp.

What any Python proxy on this stack pays at least: daphne in, one aiohttp call out,
the response relayed chunk by chunk. No auth, no pool, no Node.
Run: ``python scripts/bench_proxy.py --port N --upstream http://127.0.0.1:M``.
"""

from __future__ import annotations

import argparse
from typing import Any

import daphne.server  # noqa: F401  (installs the asyncio reactor before anything else)


class Proxy:
    """ASGI app: read the body, make one upstream call, relay the response as it arrives."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: Any = None  # made on first use, inside the running loop

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        async with self.session.request(
            scope["method"],
            self.upstream + scope["path"],
            data=body,
            headers={"content-type": "application/json"},
        ) as upstream:
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status,
                    "headers": [(b"content-type", upstream.headers["content-type"].encode())],
                }
            )
            async for chunk in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    from daphne.server import Server

    endpoint = f"tcp:port={args.port}:interface=127.0.0.1:backlog=1024"
    Server(
        Proxy(args.upstream),
        endpoints=[endpoint],
        signal_handlers=True,
        action_logger=None,
        verbosity=0,
        ready_callable=lambda: print("ready", flush=True),
    ).run()


if __name__ == "__main__":
    main()
