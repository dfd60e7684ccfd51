"""What a managed request costs the Edge over a legacy one (R-MGD-12), in process.

The Edge's request path (``OpenAIApp``: auth, scope, admission, the run frame, relay, meter)
with a scripted Node on its hub, driven as daphne drives it, N non-stream chat requests at a
time, once with a principal token on a legacy document and once with a route key on the same
document in managed mode (route table, slot unsealed, lease envelope sealed and signed per
run). The figure is process CPU time per request; the difference between the two modes is
what managed mode adds. A second legacy run in every round is the A/A noise floor. daphne,
Twisted and the websocket are the same in both modes and are left out. Reports, never
asserts (docs/performance-history.md, "Managed mode").

Alone: ``.venv/bin/python scripts/bench_managed.py [--requests 2000 --rounds 5]``; in
``make bench`` as the ``managed`` cell (a child process: it sets up Django on a database of
its own).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

from bench_cells import BenchContext, epilogue  # noqa: E402

from tests.support.processes import migrated_template, sha256_hex  # noqa: E402

LEGACY_TOKEN = "bench-legacy-token-6b1f0e2c9d"


def _setup(directory: Path) -> None:
    database = directory / "bench.sqlite3"
    shutil.copyfile(migrated_template(), database)
    os.environ["DATABASE_URL"] = f"sqlite:///{database}"
    os.environ["IOP_VAR_DIR"] = str(directory / "var")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "iop_site.settings")
    import django

    django.setup()


def _documents(directory: Path) -> tuple[dict[str, Any], dict[str, Any], str, Any]:
    """(managed document, the same document in legacy mode, route key, managed keys)."""
    from catalog.documents import document_to_catalog
    from catalog.keyring import new_keyring
    from catalog.slots import create_route, set_slot
    from secretref.keyfiles import create_private
    from tests.support.managed import managed_document, mint_keys

    keys = mint_keys(directory / "keys", "n1")
    keyring = directory / "keyring.json"
    create_private(keyring, new_keyring("k1").dump().encode())
    managed = managed_document(keys, keyring)
    managed["provider_pool"]["max_queue"] = 64
    document_to_catalog(managed)
    from catalog.keyring import Keyring

    set_slot("general", "glm", b"sk-bench-" + b"x" * 40, Keyring.load(keyring))
    key = create_route("bench", "glm", {"glm-general": "general"})
    legacy = copy.deepcopy(managed)
    del legacy["credential_plane"]
    del legacy["nodes"][0]["credential_recipient"]
    legacy["openai"]["principal_tokens"] = [
        {
            "token_ref": "bench",
            "principal_ref": "bench",
            "token_hash_sha256": sha256_hex(LEGACY_TOKEN),
        }
    ]
    # The legacy group holds only the provider the route has a slot for: the same pool work.
    legacy["models"][0]["providers"] = {"glm-general": "glm-4.6"}
    from catalog.config import load_snapshot
    from catalog.route_reader import rebuild_route_table
    from pool.http.managed import ManagedKeys

    managed_keys = ManagedKeys.load(load_snapshot(managed))
    rebuild_route_table(managed_keys)
    return managed, legacy, key, managed_keys


class Mode:
    """One Edge request path (OpenAIApp over a real pool and hub) with a scripted Node."""

    def __init__(self, document: dict[str, Any], token: str, keys: Any = None) -> None:
        from pool.http.app import OpenAIApp
        from tests.support.inprocess import Runtime

        self.runtime = Runtime(document, managed_keys=keys)
        self.app = OpenAIApp(self.runtime)
        self.token = token

    async def start(self) -> None:
        from tests.support.inprocess import FakeNode

        self.node = FakeNode(self.runtime.hub, "n1")
        await self.node.start()

    async def run(self, requests: int, concurrency: int = 16) -> float:
        """CPU seconds per request over ``requests`` requests, ``concurrency`` at a time."""
        from tests.support.inprocess import Call
        from tests.support.payloads import chat_body

        body = chat_body("ping", model="glm")

        async def one() -> None:
            call = await Call(
                self.app, "POST", "/v1/chat/completions", body, token=self.token
            ).done()
            assert call.status == 200, call.body

        gc.collect()  # each run starts from the same heap: what earlier runs kept is gone
        started = time.process_time()
        for _ in range(requests // concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))
        spent = time.process_time() - started
        self.node.runs.clear()
        self.node.frames.clear()
        self.runtime.meter.records.clear()
        return spent / (requests // concurrency * concurrency)


async def _measure(requests: int, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="iop-bench-managed-") as name:
        directory = Path(name)
        _setup(directory)
        from asgiref.sync import sync_to_async

        managed_doc, legacy_doc, key, keys = await sync_to_async(_documents)(directory)
        modes = {
            "legacy": Mode(legacy_doc, LEGACY_TOKEN),
            "legacy (A/A)": Mode(legacy_doc, LEGACY_TOKEN),
            "managed": Mode(managed_doc, key, keys),
        }
        for mode in modes.values():
            await mode.start()
            await mode.run(min(requests, 320))  # warm up
        runs: dict[str, list[float]] = {name: [] for name in modes}
        order = list(modes)
        for turn in range(rounds):
            for name in order[turn % 3 :] + order[: turn % 3]:  # rotate the order per round
                runs[name].append(await modes[name].run(requests))
        return runs


@epilogue
def managed_epilogue(ctx: BenchContext) -> str:
    """The hook `scripts/bench.py` runs after its rounds (scripts/bench_cells.py)."""
    if ctx.options.suite and "managed" not in ctx.options.suite:
        return ""
    rounds = str(max(ctx.options.rounds, 3))
    done = subprocess.run(
        [sys.executable, __file__, "--requests", "1600", "--rounds", rounds],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        return f"managed mode cell failed: {done.stderr.strip().splitlines()[-1:]}"
    return "Managed mode against legacy (R-MGD-12)\n" + done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    runs = asyncio.run(_measure(args.requests, args.rounds))
    medians = {name: statistics.median(values) * 1e6 for name, values in runs.items()}
    print(
        f"Edge CPU per non-stream request, in process, c=16, {args.requests} requests x "
        f"{args.rounds} rounds, load {load[0]:.2f} before / {os.getloadavg()[0]:.2f} after"
    )
    for name, value in medians.items():
        spread = ", ".join(f"{v * 1e6:.0f}" for v in runs[name])
        print(f"  {name:13s} {value:7.1f} us  (rounds: {spread})")
    print(
        f"  managed - legacy: {medians['managed'] - medians['legacy']:+.1f} us; "
        f"A/A: {medians['legacy (A/A)'] - medians['legacy']:+.1f} us"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
