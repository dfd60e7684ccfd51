"""Summarise a py-spy raw (collapsed) profile: where the samples' time went.

``python scripts/bench_profile.py var/bench/profile/edge-json.txt [--top 20]``
prints self time by package area and by function, and inclusive time of the project's own
functions. `make bench` writes these files with ``--profile DIR``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^():]+)(?::\d+)?\)$")
# First match wins; paths are as py-spy prints them (site-packages relative, or project).
AREAS = [
    ("twisted", "twisted/"),
    ("daphne", "daphne/"),
    ("autobahn", "autobahn/"),
    ("channels", "channels/"),
    ("asgiref", "asgiref/"),
    ("django", "django/"),
    ("aiohttp", "aiohttp/"),
    ("websockets", "websockets/"),
    ("msgspec", "msgspec"),
    ("json (stdlib)", "json/"),
    ("email (stdlib)", "email/"),
    ("logging", "logging/"),
    ("asyncio", "asyncio/"),
    ("selectors/socket", "selectors.py"),
    ("selectors/socket", "socket"),
    ("pool/http", "pool/http/"),
    ("pool/engine", "pool/engine/"),
    ("pool (other)", "pool/"),
    ("nodes/agent", "nodes/agent/"),
    ("nodes (hub, wire)", "nodes/"),
    ("catalog", "catalog/"),
]


# A sample belongs to the leaf-most frame that matches one of these (first rule wins per frame);
# the generic loop rules apply only when no frame matches a specific one.
SPECIFIC = [
    ("socket writes", ("untilConcludes", "writeSomeData", "_SelectorSocketTransport.write")),
    (
        "HTTP header parsing (Twisted, email)",
        ("email/", "_parseContentType", "lineReceived", "headerReceived", "addRawHeader"),
    ),
    ("access log formatting (Twisted)", ("combinedLogFormatter", "HTTPFactory.log")),
    (
        "websocket frames (autobahn, websockets)",
        ("autobahn/", "daphne/ws_protocol.py", "websockets/"),
    ),
    ("Channels consumer plumbing", ("channels/",)),
    ("project: pool/http", ("pool/http/",)),
    ("project: pool/engine", ("pool/engine/",)),
    ("project: metering", ("pool/metering/", "prometheus_client/")),
    ("project: nodes/agent", ("nodes/agent/",)),
    ("project: hub and wire", ("nodes/",)),
    ("daphne HTTP glue", ("daphne/",)),
    ("aiohttp client", ("aiohttp/",)),
]
GENERIC = [
    ("Twisted reactor", ("twisted/",)),
    ("asyncio loop and epoll", ("asyncio/", "selectors")),
]


def phase(frames: list[tuple[str, str]]) -> str:
    """The phase a sample's time belongs to (see SPECIFIC and GENERIC).

    Frames above the loop's first callback (startup code, ``Server.run``) own nothing.
    """
    cut = next((i for i, (func, _) in enumerate(frames) if func == "Handle._run"), len(frames))
    work = frames[cut:] or frames[-1:]
    for rules in (SPECIFIC, GENERIC):
        for func, file in reversed(work):
            text = f"{func} ({file})"
            for name, markers in rules:
                if any(marker in text for marker in markers):
                    return name
    return "other"


def area(path: str) -> str:
    for name, marker in AREAS:
        if marker in path:
            return name
    return "other"


def parse(path: Path) -> list[tuple[list[tuple[str, str]], int]]:
    """[(frames root..leaf as (function, file)), count] from a py-spy --format raw file."""
    stacks = []
    for line in path.read_text().splitlines():
        body, _, count = line.rpartition(" ")
        frames = []
        for raw in body.split(";"):
            match = FRAME.match(raw)
            frames.append((match["func"], match["file"]) if match else (raw, ""))
        if frames and count.isdigit():
            stacks.append((frames, int(count)))
    return stacks


# Under uvloop the loop itself is native code: a sample whose innermost Python frame is the
# call that entered it is epoll waiting or uvloop's own work, which py-spy cannot tell apart.
NATIVE_LOOP_ENTRIES = {
    ("AsyncioSelectorReactor.run", "twisted/internet/asyncioreactor.py"),  # the Edge
    ("Runner.run", "asyncio/runners.py"),  # the Node
}


def idle(frames: list[tuple[str, str]]) -> bool:
    """Waiting in epoll: a non-blocking py-spy cannot always tell that this is idle."""
    func, file = frames[-1]
    if (func, file) in NATIVE_LOOP_ENTRIES:
        return True
    return file.endswith("selectors.py") and func.endswith(".select")


def summary(path: Path, top: int) -> str:
    everything = parse(path)
    stacks = [(frames, count) for frames, count in everything if not idle(frames)]
    waiting = sum(count for _, count in everything) - sum(count for _, count in stacks)
    total = sum(count for _, count in stacks) or 1
    by_area: Counter[str] = Counter()
    by_func: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    for frames, count in stacks:
        phases[phase(frames)] += count
        func, file = frames[-1]
        by_area[area(file)] += count
        by_func[f"{func} ({file})"] += count
        own = {f"{f} ({p})" for f, p in frames if p.startswith(("pool/", "nodes/", "iop_site/"))}
        for name in own:
            inclusive[name] += count

    def block(title: str, counter: Counter[str]) -> list[str]:
        rows = [f"  {100 * n / total:5.1f}%  {name}" for name, n in counter.most_common(top)]
        return [title, *rows]

    lines = [
        f"{path.name}: {total} busy samples (+{waiting} waiting in epoll or inside uvloop's "
        "native loop, left out)"
    ]
    lines += block("time by phase:", phases)
    lines += block("self time by area:", by_area)
    lines += block("self time by function:", by_func)
    lines += block("inclusive time of project functions:", inclusive)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    print("\n\n".join(summary(path, args.top) for path in args.files))


if __name__ == "__main__":
    main()
