"""Where translation runs, by measurement (docs/performance-history.md, "Translation").

1. Each stream translator alone: microseconds per upstream event (recorded shapes).
2. Request + whole-answer translation: microseconds per request.
3. The Edge's own request path, in process (``OpenAIApp`` with a scripted Node on the real
   pool and hub): a streamed chat request of 20 events untranslated, and the same answer
   translated for an Anthropic client. With ``--baseline DIR`` the untranslated figure is
   also taken from another checkout (e.g. ``git archive main | tar -x -C DIR``), in a
   subprocess, the two alternating round by round, so before/after share the machine.

Bounded: ``--rounds`` (default 5) of ``--requests`` (default 300) each; medians reported.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "scripts")) if p not in sys.path]

from bench_upstream import EVENTS, SSE_EVENTS  # noqa: E402

TOKEN = "bench-token"


def chat_stream() -> list[str]:
    """The 20-event chat stream of `make bench`'s upstream (scripts/bench_upstream.py)."""
    return [event.decode() for event in SSE_EVENTS]


def anthropic_stream(events: int) -> list[str]:
    def ev(obj: dict[str, Any]) -> str:
        return f"event: {obj['type']}\ndata: " + json.dumps(obj) + "\n\n"

    start = {
        "id": "msg_b",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    out = [ev({"type": "message_start", "message": start})]
    out.append(
        ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        )
    )
    out += [
        ev(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": f"word{i} "},
            }
        )
        for i in range(events - 5)
    ]
    out.append(ev({"type": "content_block_stop", "index": 0}))
    out.append(
        ev(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 9},
            }
        )
    )
    out.append(ev({"type": "message_stop"}))
    return out


def per_event_us(make: Any, stream: list[str], rounds: int, repeat: int) -> float:
    results = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeat):
            translator = make()
            for event in stream:
                translator.feed(event)
            translator.close()
        results.append((time.perf_counter() - started) / (repeat * len(stream)) * 1e6)
    return statistics.median(results)


def translators(rounds: int) -> dict[str, float]:
    from nodes.agent.adapters.sse import UsageScanner
    from pool.translate.chat_via_messages_stream import ChatViaMessagesStream
    from pool.translate.messages_via_chat_stream import MessagesViaChatStream
    from pool.translate.responses_via_chat_stream import ResponsesViaChatStream

    chat, anthropic = chat_stream(), anthropic_stream(EVENTS)
    repeat = 50
    return {
        "chat -> anthropic events (us/event)": per_event_us(
            lambda: MessagesViaChatStream("m"), chat, rounds, repeat
        ),
        "chat -> responses events (us/event)": per_event_us(
            lambda: ResponsesViaChatStream("m", {}), chat, rounds, repeat
        ),
        "anthropic -> chat chunks (us/event)": per_event_us(
            lambda: ChatViaMessagesStream("m", True), anthropic, rounds, repeat
        ),
        "node usage scan, for scale (us/event)": per_event_us(
            _Scanner(UsageScanner), chat, rounds, repeat
        ),
    }


class _Scanner:
    """The Node's existing per-event work on a relayed stream, as a translator-shaped object."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def __call__(self) -> Any:
        scanner = self.cls()

        class Wrap:
            def feed(self, text: str) -> None:
                scanner.feed(text)

            def close(self) -> None:
                scanner.feed("\n")

        return Wrap()


def requests(rounds: int) -> dict[str, float]:
    from pool.translate import messages_via_chat as mvc

    body = {
        "model": "m",
        "max_tokens": 256,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "hello " * 50},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "more"},
        ],
        "tools": [
            {
                "name": "f",
                "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
            }
        ],
    }
    answer = json.dumps(
        {
            "id": "c",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "word " * 100},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 100},
        }
    )
    results = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(2000):
            mvc.chat_request(body, "served")
            mvc.messages_response(answer)
        results.append((time.perf_counter() - started) / 2000 * 1e6)
    return {"anthropic request + whole answer (us/request)": statistics.median(results)}


def _document() -> dict[str, Any]:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    provider = {"id": "p", "profile": "openai", "base_url": "http://127.0.0.1:9/v1", "capacity": 64}
    models: list[dict[str, Any]] = [{"id": "plain", "providers": {"p": "served"}}]
    if os.environ.get("BENCH_TRANSLATE_GROUP"):
        models.append({"id": "xlate", "providers": {"p": "served"}, "translate": True})
    return {
        "edge": {"id": "e", "listen": "127.0.0.1:17000"},
        "admin": {"listen": "127.0.0.1:17001"},
        "provider_pool": {"max_queue": 64, "queue_timeout_ms": 30000},
        "openai": {
            "listen": "127.0.0.1:17002",
            "principal_tokens": [
                {"token_ref": "a", "token_hash_sha256": digest, "principal_ref": "t"}
            ],
        },
        "nodes": [{"id": "n1", "token_hash_sha256": digest, "providers": [provider]}],
        "models": models,
    }


async def _app_rounds(rounds: int, count: int, translated: bool) -> float:
    sys.path.insert(0, str(Path.cwd()))
    from pool.http.app import OpenAIApp
    from tests.support.inprocess import Call, FakeNode, Runtime

    stream = chat_stream()

    async def answer(node: Any, run: Any) -> None:
        for event in stream:
            await node.emit(run.run_id, event)
        await node.end(run.run_id)

    runtime = Runtime(_document())
    node = await FakeNode(runtime.hub).start()
    node.script = answer
    app = OpenAIApp(runtime)
    if translated:
        path, model = "/v1/messages", "xlate"
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": 16,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    else:
        path, model = "/v1/chat/completions", "plain"
        body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    import pool.http.app as module

    print(module.__file__, file=sys.stderr)  # the parent checks which tree was measured
    for _ in range(min(count, 50)):  # warm-up: imports, caches, the first allocations
        await Call(app, "POST", path, body, token=TOKEN).done()
    results = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(count):
            call = await Call(app, "POST", path, body, token=TOKEN).done()
            assert call.status == 200, call.body
        results.append((time.perf_counter() - started) / count * 1e6)
    await runtime.hub.aclose()
    return statistics.median(results)


def app_figure(rounds: int, count: int, translated: bool, tree: Path) -> float:
    """One figure in a subprocess whose imports come from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "DJANGO_SETTINGS_MODULE": "iop_site.settings"}
    if translated:
        env["BENCH_TRANSLATE_GROUP"] = "1"
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--app-only",
        "--rounds",
        str(rounds),
        "--requests",
        str(count),
    ]
    if translated:
        args.append("--translated")
    out = subprocess.run(
        args, cwd=tree, env=env, check=True, capture_output=True, text=True, timeout=600
    )
    measured = Path(out.stderr.strip().splitlines()[-1]).resolve()
    if not measured.is_relative_to(tree.resolve()):
        raise SystemExit(f"measured {measured}, not a module of {tree}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--baseline", type=Path, help="another checkout for the before figure")
    parser.add_argument("--app-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--translated", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.app_only:
        print(asyncio.run(_app_rounds(args.rounds, args.requests, args.translated)))
        return
    figures: dict[str, float] = {}
    figures.update(translators(args.rounds))
    figures.update(requests(args.rounds))
    after, before, translated = [], [], []
    for turn in range(args.rounds):  # alternate, and swap the order every other round
        pair = [(after, ROOT)]
        if args.baseline:
            pair.append((before, args.baseline))
        for into, tree in pair if turn % 2 == 0 else pair[::-1]:
            into.append(app_figure(1, args.requests, False, tree))
        translated.append(app_figure(1, args.requests, True, ROOT))
    figures[f"edge in process, chat stream {EVENTS} events, untranslated (us/request)"] = (
        statistics.median(after)
    )
    figures["edge in process, same answer translated for /v1/messages (us/request)"] = (
        statistics.median(translated)
    )
    if before:
        figures[f"edge in process, untranslated, baseline {args.baseline} (us/request)"] = (
            statistics.median(before)
        )
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, value in figures.items():
        print(f"{value:10.2f}  {name}")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
