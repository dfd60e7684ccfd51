"""In-process pieces for HTTP-surface tests: a runtime with a real pool and NodeHub, a
scripted Node on that hub, and an ASGI driver that behaves like daphne (body messages first,
``http.disconnect`` when the client leaves and after the final response chunk)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from catalog.config import load_snapshot
from catalog.route_reader import refresh_route_table
from iop_site.health import HealthWatch
from nodes import wire
from nodes.hub import NodeHub
from pool.engine import ProviderPool
from pool.gate.counters import GateCounts
from pool.http.managed import ManagedKeys
from pool.metering.budget_view import BudgetView
from pool.metering.pending import hour_bucket
from pool.policy import policy_from_snapshot
from tests.support.payloads import chat_body
from tests.support.processes import sha256_hex

if TYPE_CHECKING:
    from pool.http.app import OpenAIApp

WAIT = 5.0
TOKEN = "tok-test-caller-7f3a"  # the caller of ``document()``


class RecordingMeter:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.dropped: list[str] = []
        self.estimates: list[tuple[float, float]] = []
        self.budgets = BudgetView()

    def configure_budgets(self, kinds: dict[str, Any]) -> None:
        self.budgets.configure(kinds)
        self.budgets.read_failed(time.time())  # no ledger here: what this meter counted

    def queue_estimate(self, estimated_s: float, actual_s: float) -> None:
        self.estimates.append((estimated_s, actual_s))

    def translation_dropped(self, fields: Any) -> None:
        self.dropped.extend(fields)

    def record(self, record: Any) -> None:
        self.records.append(record)
        tokens = record.input_tokens + record.output_tokens
        self.budgets.add(record.principal_ref or "-", hour_bucket(time.time()), tokens, 0)


class Runtime:
    """What OpenAIApp reads of EdgeRuntime, with a meter that keeps its records."""

    def __init__(self, doc: dict[str, Any], managed_keys: ManagedKeys | None = None) -> None:
        self.snapshot = load_snapshot(doc)
        self.managed_keys = managed_keys  # managed mode: keys read once, the route table
        self.started_at = time.time()
        self.pool = ProviderPool(policy_from_snapshot(self.snapshot))
        self.health = HealthWatch(self.pool)
        self.hub = NodeHub(lambda: self.snapshot, self.pool)
        self.meter = RecordingMeter()
        self.gate = GateCounts()
        self.draining = False

    def credentials_changed(self) -> None:
        """As EdgeRuntime: a route or slot saved in this process rebuilds the table."""
        if self.managed_keys is not None:
            refresh_route_table(self.managed_keys)


Script = Callable[["FakeNode", Any], Awaitable[None]]


async def answer_ok(node: FakeNode, run: Any) -> None:
    if run.stream:
        for word in ("data: one\n\n", "data: two\n\n"):
            await node.emit(run.run_id, word)
    else:
        await node.emit(run.run_id, '{"ok":')
        await node.emit(run.run_id, "true}")
    await node.end(run.run_id, usage=wire.Usage(input_tokens=3, output_tokens=2))


class FakeNode:
    """Plays a Node on the hub: register -> ready, then runs each request by ``script``."""

    def __init__(self, hub: NodeHub, node_id: str = "n1") -> None:
        self.hub = hub
        self.node_id = node_id
        self.runs: list[Any] = []
        self.frames: list[bytes] = []
        self.cancelled: list[str] = []
        self.body_parts: dict[str, list[str]] = {}
        self.credits: list[wire.Credit] = []
        self.cancel_seen = asyncio.Event()
        self.run_seen = asyncio.Event()
        self.script: Script = answer_ok
        self.release = asyncio.Event()  # scripts that hold a run wait on this
        self._register: wire.RegisterResponse | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> FakeNode:
        self.session = await self.hub.connect(self.node_id, self)
        await self.hub.receive(
            self.session,
            wire.encode(wire.Register(node_id=self.node_id, protocol=wire.PROTOCOL_VERSION)),
        )
        assert self._register is not None
        await self.hub.receive(
            self.session,
            wire.encode(
                wire.Ready(
                    generation=self._register.generation, revision=self._register.payload.revision
                )
            ),
        )
        return self

    async def send(self, frame: bytes) -> None:
        self.frames.append(frame)
        msg = wire.decode_from_edge(frame)
        if isinstance(msg, wire.RegisterResponse):
            self._register = msg
        elif isinstance(msg, wire.RunBodyPart):
            self.body_parts.setdefault(msg.run_id, []).append(msg.data)
        elif isinstance(msg, wire.Credit):
            self.credits.append(msg)
        elif isinstance(msg, wire.TunnelRequest | wire.RunRequest):
            if msg.body_parts:  # R-IN-2: the body came first, in parts
                parts = self.body_parts.pop(msg.run_id)
                assert len(parts) == msg.body_parts
                msg.body = msgspec.Raw("".join(parts).encode())
            self.runs.append(msg)
            self.run_seen.set()
            task = asyncio.ensure_future(self.script(self, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(msg, wire.Cancel):
            self.cancelled.append(msg.run_id)
            self.cancel_seen.set()

    async def close(self, code: int) -> None:
        pass

    async def emit(self, run_id: str, data: str) -> None:
        await self.hub.receive(self.session, wire.encode(wire.RunEvent(run_id=run_id, data=data)))

    async def end(
        self,
        run_id: str,
        ok: bool = True,
        error: wire.RunError | None = None,
        usage: wire.Usage | None = None,
    ) -> None:
        await self.hub.receive(
            self.session, wire.encode(wire.RunEnd(run_id=run_id, ok=ok, error=error, usage=usage))
        )


class Call:
    """One request through the app, driven the way daphne drives it."""

    def __init__(
        self,
        app: OpenAIApp,
        method: str,
        path: str,
        body: Any = b"",
        headers: dict[str, str] | None = None,
        chunks: list[bytes] | None = None,
        token: str | None = None,
    ) -> None:
        raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
        hdrs = {"content-type": "application/json", **(headers or {})}
        if token is not None:
            hdrs.setdefault("authorization", f"Bearer {token}")
        if chunks is None:
            hdrs["content-length"] = str(len(raw))
            chunks = [raw]
        self.scope = {
            "type": "http",
            "method": method,
            "path": path,
            "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()],
        }
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for i, chunk in enumerate(chunks):
            self.inbox.put_nowait(
                {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
            )
        self.sent: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.task = asyncio.ensure_future(app(self.scope, self.inbox.get, self._send))

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.changed.set()
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.inbox.put_nowait({"type": "http.disconnect"})  # as daphne does

    def disconnect(self) -> None:
        self.inbox.put_nowait({"type": "http.disconnect"})

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    async def done(self) -> Call:
        await asyncio.wait_for(self.task, WAIT)
        return self

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]

    @property
    def body(self) -> bytes:
        return b"".join(self.bodies)

    def json(self) -> Any:
        return json.loads(self.body)


async def started(doc: dict[str, Any]) -> tuple[OpenAIApp, Runtime, FakeNode]:
    """The app on ``doc`` with one fake Node (``n1``) connected and ready."""
    from pool.http.app import OpenAIApp

    runtime = Runtime(doc)
    node = await FakeNode(runtime.hub).start()
    return OpenAIApp(runtime), runtime, node


async def stop(runtime: Runtime) -> None:
    """Close the hub and the health timer; every lease must be back (R-POOL-9)."""
    await runtime.hub.aclose()
    runtime.health.close()
    assert runtime.pool.idle(), "every lease released and no waiter left (R-POOL-9)"


async def until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate`` holds (a state with no event of its own); bounded."""
    async with asyncio.timeout(WAIT):
        for _ in range(100_000):
            if predicate():
                return
            await asyncio.sleep(0)
    raise AssertionError("condition not reached")


# --- the in-process test document ---------------------------------------------------------


def document(**openai: Any) -> dict[str, Any]:
    return {
        "edge": {"id": "e", "listen": "127.0.0.1:17000"},
        "admin": {"listen": "127.0.0.1:17001"},
        "provider_pool": {"max_queue": 1, "queue_timeout_ms": 30000},
        "openai": {
            "listen": "127.0.0.1:17002",
            "principal_tokens": [
                {
                    "token_ref": "app-a",
                    "token_hash_sha256": sha256_hex(TOKEN),
                    "principal_ref": "team-a",
                }
            ],
            "long_context_threshold_tokens": 200,
            "max_request_bytes": 4096,
            **openai,
        },
        "protocol_profiles": {
            "messages_api": {
                "driver": "anthropic_messages",
                "base_url": "http://127.0.0.1:9/v1",
                "operations": {"messages": "/messages", "count_tokens": "/messages/count_tokens"},
                "capabilities": ["messages", "streaming", "tool_calling", "count_tokens"],
            }
        },
        "nodes": [
            {
                "id": "n1",
                "token_hash_sha256": sha256_hex("node"),
                "providers": [
                    {
                        "id": "p-open",
                        "profile": "openai",
                        "base_url": "http://127.0.0.1:9/v1",
                        "capacity": 1,
                        "long_context_capacity": 1,
                        "context_window_tokens": 8192,
                    },
                    {"id": "p-anth", "profile": "messages_api"},
                    {"id": "p-oll", "profile": "ollama", "base_url": "http://127.0.0.1:9"},
                ],
            }
        ],
        "models": [
            {"id": "gpt", "providers": {"p-open": "served-gpt"}},
            {"id": "claude", "providers": {"p-anth": "served-claude"}},
            {"id": "local", "providers": {"p-oll": "qwen:7b"}},
        ],
    }


def api(app: OpenAIApp, method: str, path: str, body: Any = b"", **kw: Any) -> Call:
    """A request as the test caller (with its token unless ``token`` is given)."""
    kw.setdefault("token", TOKEN)
    return Call(app, method, path, body, **kw)


def chat(stream: bool = False, model: str = "gpt", **extra: Any) -> dict[str, Any]:
    """A chat request on ``document()``'s models (``gpt``, ``claude``, ``local``)."""
    return chat_body("hi", model=model, stream=stream, **extra)
