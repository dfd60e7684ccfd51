"""What `make bench` measures, and the hook that adds more.

A *cell* is one target (a server under test) driven in one mode (``json`` or ``stream``)
at one concurrency. A *suite* starts what its cells need and yields them; register one
with ``@suite("name")`` in a module of ``scripts/`` and add the module's name to
``SUITE_MODULES`` below. ``scripts/bench.py`` enters every suite, then runs all cells in
interleaved rounds (every cell once per round, so they share the machine's conditions),
and reports medians and spread. A suite may also add rows to the targets table with
``@check``. See docs/performance.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_client import Probe
from bench_upstream import EVENTS

if TYPE_CHECKING:
    from bench_report import Check, Figures

ROOT = Path(__file__).resolve().parent.parent
# Modules whose import registers more suites or checks (each one: scripts/<name>.py).
SUITE_MODULES: tuple[str, ...] = (
    "bench_tls", "bench_limits", "bench_managed", "bench_gate", "bench_scale", "bench_tracing",
    "bench_peers", "bench_streams", "bench_queue", "bench_affinity",
)  # fmt: skip
BODIES = {
    "json": {"model": "bench", "messages": [{"role": "user", "content": "ping"}]},
    "stream": {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "ping"}]},
}
# --translated: the same upstream answer translated for an Anthropic client (R-XLATE-1):
# message_start, content_block_start, the text deltas, content_block_stop, message_delta,
# message_stop (the upstream's role chunk and [DONE] carry no event of their own).
TRANSLATED_BODIES = {
    mode: {"model": "bench-translated", "max_tokens": 64,
           **{k: v for k, v in body.items() if k != "model"}}
    for mode, body in BODIES.items()
}  # fmt: skip
TRANSLATED_EVENTS = EVENTS + 2


@dataclass(frozen=True)
class Target:
    """One server under test: where to POST, with which client token, and its processes
    (name -> pid: CPU per request is read for each)."""

    name: str
    port: int
    pids: dict[str, int]
    token: str = ""
    path: str = "/v1/chat/completions"
    tls: ssl.SSLContext | None = None  # client context for an https target
    metrics_url: str = ""  # an Edge's /metrics: loop lag per run is read from it
    bodies: dict[str, Any] = field(default_factory=lambda: BODIES)  # by mode
    events: int = EVENTS  # data events a stream answer must carry
    # Several Edges: every one's port on 127.0.0.1; wrk's connections alternate over them
    # (``port`` is the one the check and the probe use). Empty: ``port`` only.
    spread: tuple[int, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()  # sent with every request (a peer's routing)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}{self.path}"

    def body(self, mode: str) -> bytes:
        return json.dumps(self.bodies[mode]).encode()

    def probe(self, mode: str) -> Probe:
        return Probe(
            "127.0.0.1", self.port, self.path, self.body(mode), self.token, self.tls, self.headers
        )


@dataclass(frozen=True)
class Cell:
    target: Target
    mode: str  # json | stream
    c: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.target.name, self.mode, self.c)


@dataclass
class BenchContext:
    """What every suite gets: the shared upstream, the options, a scratch directory."""

    upstream_port: int
    upstream_pid: int
    workdir: Path
    options: Any  # argparse.Namespace of bench.py
    server_cpu: int | None = None  # where the server under test is pinned (None: not pinned)
    peer_cpu: int | None = None  # Node, upstream and load generators
    pinned: dict[str, int] = field(default_factory=dict)  # process name -> CPU, for the report
    memory_pids: dict[str, int] = field(default_factory=dict)  # RSS reported for these
    all_cpus: set[int] = field(default_factory=set)  # what bench.py could use at start

    def pin(self, name: str, pid: int, server: bool) -> None:
        """Pin every thread of ``pid`` to the server's or the peers' CPU (no-op unpinned)."""
        cpu = self.server_cpu if server else self.peer_cpu
        if cpu is None:
            return
        pin_process(pid, {cpu})
        self.pinned[name] = cpu


Suite = Callable[[BenchContext], AbstractContextManager[list[Cell]]]
SUITES: dict[str, Suite] = {}
CHECKS: list[Callable[[Figures], list[Check]]] = []
SECTIONS: list[Callable[[Figures], list[str]]] = []  # more report lines from the medians
EPILOGUES: list[Callable[[BenchContext], str]] = []  # own measurements after the rounds
MEASURED: dict[str, Any] = {}  # what suites measured besides the cells, for --json


def suite(name: str) -> Callable[[Callable[[BenchContext], Iterator[list[Cell]]]], Suite]:
    """Register a generator function (``contextmanager`` style) that yields its cells."""

    def register(fn: Callable[[BenchContext], Iterator[list[Cell]]]) -> Suite:
        SUITES[name] = contextmanager(fn)
        return SUITES[name]

    return register


def check(fn: Callable[[Figures], list[Check]]) -> Callable[[Figures], list[Check]]:
    """Register rows for the targets table, computed from the medians."""
    CHECKS.append(fn)
    return fn


def bench_providers(ctx: BenchContext, capacity: int = 256) -> list[dict[str, Any]]:
    """The one provider every bench Edge has, on the shared upstream (capacity 256 unless
    said otherwise: the open-streams measurement needs more)."""
    return [
        {
            "id": "p-bench",
            "profile": "openai",
            "capacity": capacity,
            "base_url": f"http://127.0.0.1:{ctx.upstream_port}/v1",
        }
    ]


@contextmanager
def edge_stack(
    ctx: BenchContext,
    name: str,
    env: dict[str, str] | None = None,
    pin: bool = True,
    one_core: bool = False,
    capacity: int = 256,
    root: Path = ROOT,
    **config: Any,
) -> Iterator[Target]:
    """A real Edge and Node (tests.support.Stack) with one provider of ``capacity`` on the
    shared upstream, pinned like the core cells unless ``pin`` is false (``one_core``: the Node
    too on the server's CPU); ``config`` is merged into the Edge config (``openai=...`` for
    instance); ``root``: the checkout it runs from (a ``--baseline``). Yields the target
    named ``name``."""
    from tests.support import Stack

    # scripts/bench_diag/sitecustomize.py acts only on the IOP_BENCH_* variables.
    env = {"PYTHONPATH": f"{ROOT / 'scripts' / 'bench_diag'}{os.pathsep}{root}", **(env or {})}
    node_python = env.pop(NODE_PYTHON, None)
    if node_python and not Path(node_python).exists():
        raise RuntimeError(f"{node_python} is missing (docs/performance.md, --variant node-py312)")
    if ctx.options.diagnose:
        out = Path(ctx.options.diagnose).resolve()
        out.mkdir(parents=True, exist_ok=True)
        env["IOP_BENCH_GC_LOG"] = str(out / f"gc-{name}")
    with Stack(
        ctx.workdir / name,
        upstreams={},
        providers=bench_providers(ctx, capacity),
        models=[
            {"id": "bench", "providers": {"p-bench": "bench-served"}},
            {"id": "bench-translated", "providers": {"p-bench": "bench-served"}, "translate": True},
        ],
        pool={"max_queue": 1024},
        env=env,
        log_level="WARNING",
        root=root,
        node_python=node_python,
        **config,
    ) as stack:
        assert stack.edge and stack.edge.popen and stack.nodes[0].popen
        pids = {"edge": stack.edge.popen.pid, "node": stack.nodes[0].popen.pid}
        if pin:
            ctx.pin(f"{name} (Edge)", pids["edge"], server=True)
            ctx.pin(f"{name} (Node)", pids["node"], server=one_core)
        else:  # children inherit bench.py's own pinning: give them every CPU back
            for pid in pids.values():
                pin_process(pid, ctx.all_cpus)
        ctx.memory_pids.update(
            {f"{name}: {k}" if name != "edge" else k: v for k, v in pids.items()}
        )
        yield Target(
            name,
            stack.ports["openai"],
            pids,
            stack.token,
            metrics_url=stack.control_url + "/metrics",
        )
        stack.wait_idle()


# --variant NAME: a second Edge+Node, changed by scripts/bench_diag/sitecustomize.py, or (this
# key) its Node run by another interpreter.
NODE_PYTHON = "IOP_BENCH_NODE_PYTHON"
NODE_PY312 = ROOT / "var" / "node-py312" / "bin" / "python"  # docs/performance.md
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "gc": ("edge-gc-undone", {"IOP_BENCH_UNDO": "gc"}),  # no gc.freeze / set_threshold
    "gc-7000": ("edge-gc-7000", {"IOP_BENCH_GC_THRESHOLD": "7000,10,10"}),  # 10x young gen
    "unpinned": ("edge-unpinned", {}),  # the OS places the Edge and the Node
    # the event loop (nodes/loop.py): asyncio's own under both, or under the Edge only
    "asyncio": ("edge-asyncio", {"IOP_EVENT_LOOP": "asyncio"}),
    "uvloop": ("edge-uvloop", {"IOP_EVENT_LOOP": "uvloop"}),  # as shipped, for an A/B in order
    "asyncio-edge": ("edge-asyncio-edge", {"IOP_BENCH_ASYNCIO_IN": "edge"}),
    # the Node on Python 3.12 (aiohttp writes a request body without a task of its own there)
    "node-py312": ("edge-node-py312", {NODE_PYTHON: str(NODE_PY312)}),
}


@suite("variants")
def variants_suite(ctx: BenchContext) -> Iterator[list[Cell]]:
    """Each ``--variant`` (VARIANTS) beside the shipped Edge at c=1 and 16, same rounds; with
    ``--baseline REV``, that revision's Edge+Node, as ``edge`` and as ``edge-1core`` run."""
    with contextlib.ExitStack() as stack:
        cells: list[Cell] = []
        for variant in ctx.options.variant or []:
            name, env = VARIANTS[variant]
            pin = variant != "unpinned"
            target = stack.enter_context(edge_stack(ctx, name, env, pin=pin))
            cells += [Cell(target, mode, c) for mode in BODIES for c in (1, 16)]
        if getattr(ctx.options, "baseline", None):
            rev, root = baseline_checkout(ctx.options.baseline)
            for name, one_core in ((f"edge@{rev}", False), (f"edge-1core@{rev}", True)):
                target = stack.enter_context(edge_stack(ctx, name, one_core=one_core, root=root))
                cells += [Cell(target, mode, c) for mode in BODIES for c in (1, 16)]
        yield cells


BASELINES = ROOT / "var" / "bench" / "baseline"


def baseline_checkout(rev: str, under: Path = BASELINES) -> tuple[str, Path]:
    """``rev``'s short id and a worktree of it in ``under`` (made once; its Edge and Node
    run on this checkout's virtualenv)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    root = under / sha[:12]
    if not (root / "manage.py").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--force", "--detach", str(root), sha],
            cwd=ROOT, capture_output=True, check=True, timeout=120,
        )  # fmt: skip
    return sha[:12], root


def section(fn: Callable[[Figures], list[str]]) -> Callable[[Figures], list[str]]:
    """Register lines for the report (markdown), computed from the medians."""
    SECTIONS.append(fn)
    return fn


def epilogue(fn: Callable[[BenchContext], str]) -> Callable[[BenchContext], str]:
    """Register a measurement of its own, run after the rounds while the upstream is up; its
    text is appended to the report."""
    EPILOGUES.append(fn)
    return fn


def stack_epilogue(
    suite_name: str, title: str, measure: Callable[[Path], str], errors: tuple[type, ...] = ()
) -> Callable[[BenchContext], str]:
    """Register ``measure`` (a fresh stack of its own under ``workdir/edge-<suite_name>``) as
    an epilogue that runs unless ``--suite`` leaves ``suite_name`` out; a failure is reported
    as ``<title>: not measured (...)``, never a crash of the whole run."""

    def run(ctx: BenchContext) -> str:
        if ctx.options.suite and suite_name not in ctx.options.suite:
            return ""
        try:
            return measure(ctx.workdir / f"edge-{suite_name}")
        except (OSError, RuntimeError, AssertionError, *errors) as exc:
            return f"{title}: not measured ({type(exc).__name__}: {exc})"

    return epilogue(run)


def pin_process(pid: int, cpus: set[int]) -> None:
    """``taskset -a``: every thread of a process, so worker threads follow the main one."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that just ended
            continue


def cpus_for_pinning() -> tuple[int, int] | None:
    """(server CPU, peer CPU) when this process may use at least two CPUs, else None."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def run_alone(
    doc: str,
    measure: Callable[[int, float, int], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    runs_of: str,
) -> int:
    """``main`` of a cell module run by itself: its own fast upstream, ``--seconds``,
    ``--rounds`` and ``--json``; prints the rendered result."""
    import argparse
    import subprocess
    import sys

    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each wrk run")
    parser.add_argument("--rounds", type=int, default=5, help=f"runs per {runs_of}; medians count")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    upstream = subprocess.Popen(
        [sys.executable, "scripts/bench_upstream.py"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert upstream.stdout is not None
        port = int(upstream.stdout.readline().strip())
        result = measure(port, args.seconds, args.rounds)
    finally:
        upstream.terminate()
        upstream.wait(10)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
