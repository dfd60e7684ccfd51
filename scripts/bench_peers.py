"""Other gateways beside the Edge in `make bench` (docs/performance-history.md, "Against other
gateways").

- **Portkey's AI gateway** (npm ``@portkey-ai/gateway``, Node.js, ``NODE_ENV=production``,
  ``--headless``): always, when ``node`` and ``npm`` exist. Installed once from npm into
  ``var/bench-peers/portkey``; skipped with the reason otherwise.
- **LiteLLM's proxy** (one worker): only with ``--peers``, since its install is large. Installed
  once with pip into its own virtualenv, ``var/bench-peers/litellm-venv``; skipped with the reason
  when that fails.

Each peer is pinned to the server CPU (where the core cells pin the Edge), with the same
upstream and the same wrk and probe on the other CPU. Beside them runs ``edge-1core``: an
Edge *and* its Node both pinned to that one CPU, so two hops share the core one peer process
has. The section compares medians of the same rounds: req/s at c=16, added p50 at c=1
(non-stream, and stream first byte) over the upstream alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench_cells import (
    MEASURED,
    ROOT,
    BenchContext,
    Cell,
    Target,
    check,
    edge_stack,
    section,
    suite,
)
from bench_frames import Frames, per_frame
from bench_frames import render as render_frames
from bench_rate import Search, sustained
from bench_rate import render as render_rates
from bench_report import EDGE_CPU_MS, NODE_CPU_MS, Check, Figures

PEERS_DIR = ROOT / "var" / "bench-peers"
PORTKEY_VERSION = "1.15.2"
# Portkey's gateway fails every streamed answer with "TypeError: immutable" under
# @hono/node-server newer than 1.13 (Portkey-AI/gateway#1389); the cache pins the last one
# that works.
PORTKEY_PACKAGE = {
    "private": True,
    "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
    "overrides": {"@hono/node-server": "1.13.8"},
}
PORTKEY_SERVER = "node_modules/@portkey-ai/gateway/build/start-server.js"
LITELLM_SPEC = "litellm[proxy]"
ONE_CORE = "edge-1core"
CONCURRENCY = (1, 16)
SKIPPED: dict[str, str] = {}  # peer -> why it did not run, for the report
VERSIONS: dict[str, str] = {}  # peer -> installed version
# After the rounds, on the same targets: sustained rate (bench_rate), per-frame delay
# (bench_frames); or why either was not measured.
RATES: dict[str, Search] = {}
FRAMES: dict[str, Frames] = {}
NOT_MEASURED: list[str] = []
# The targets of docs/performance.md against the peers (medians of one run).
TIMES_PORTKEY, TIMES_LITELLM = 4.0, 30.0
ADDED_P50_MS, ADDED_P99_MS = 0.6, 2.0  # json, c=1, over the upstream alone
FRAME_ADDED_US = 50.0  # added delay per streamed frame (the mean gap over direct)


def _install_portkey(root: Path) -> Path:
    """The cached Portkey gateway's start script, installed from npm on first use."""
    script = root / PORTKEY_SERVER
    if script.exists():
        return script
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise RuntimeError("node and npm are not installed")
    root.mkdir(parents=True, exist_ok=True)
    (root / "package.json").write_text(json.dumps(PORTKEY_PACKAGE, indent=2))
    print(f"installing @portkey-ai/gateway {PORTKEY_VERSION} into {root}", file=sys.stderr)
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 or not script.exists():
        raise RuntimeError(f"npm install failed: {done.stderr.strip()[-300:]}")
    return script


def _install_litellm(root: Path) -> Path:
    """The cached LiteLLM proxy's ``litellm`` command, pip-installed into its own venv."""
    command = root / "bin" / "litellm"
    if command.exists():
        return command
    print(f"installing {LITELLM_SPEC} into {root} (large; once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    done = subprocess.run(
        [str(root / "bin" / "pip"), "install", "-q", LITELLM_SPEC],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if done.returncode != 0 or not command.exists():
        raise RuntimeError(f"pip install {LITELLM_SPEC} failed: {done.stderr.strip()[-300:]}")
    return command


def _version(command: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout else "?"


def _wait_listening(proc: subprocess.Popen[bytes], port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"not listening on port {port} after {seconds:.0f} s")


@contextlib.contextmanager
def _server(
    ctx: BenchContext, name: str, argv: list[str], port: int, env: dict[str, str], cwd: Path
) -> Iterator[int]:
    """A peer's process, on the server CPU from its first thread (as ``taskset -c``)."""
    cpu = ctx.server_cpu

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    proc = subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, **env}, preexec_fn=pin,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_listening(proc, port, 120)
        ctx.pin(name, proc.pid, server=True)
        ctx.memory_pids[name] = proc.pid
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _portkey(ctx: BenchContext, stack: contextlib.ExitStack) -> Target:
    from tests.support import free_port

    root = PEERS_DIR / "portkey"
    script = _install_portkey(root)
    VERSIONS["portkey"] = PORTKEY_VERSION + ", node " + _version(["node", "--version"])
    port = free_port()
    argv = ["node", str(script), f"--port={port}", "--headless"]
    pid = stack.enter_context(_server(ctx, "portkey", argv, port, {"NODE_ENV": "production"}, root))
    headers = (
        ("x-portkey-provider", "openai"),
        ("x-portkey-custom-host", f"http://127.0.0.1:{ctx.upstream_port}/v1"),
    )
    return Target("portkey", port, {"portkey": pid}, token="bench", headers=headers)


LITELLM_CONFIG = """model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench-served
      api_base: http://127.0.0.1:{port}/v1
      api_key: bench
general_settings:
  master_key: {key}
"""
LITELLM_KEY = "sk-bench-peer"  # the proxy refuses to start without a master key


def _litellm(ctx: BenchContext, stack: contextlib.ExitStack) -> Target:
    from tests.support import free_port

    root = PEERS_DIR / "litellm-venv"
    command = _install_litellm(root)
    VERSIONS["litellm"] = _version(
        [str(root / "bin" / "python"), "-c", "import importlib.metadata as m; "
         "print(m.version('litellm'))"]
    )  # fmt: skip
    config = ctx.workdir / "litellm.yaml"
    config.write_text(LITELLM_CONFIG.format(port=ctx.upstream_port, key=LITELLM_KEY))
    port = free_port()
    argv = [str(command), "--config", str(config), "--port", str(port), "--num_workers", "1"]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    pid = stack.enter_context(_server(ctx, "litellm", argv, port, env, ctx.workdir))
    return Target("litellm", port, {"litellm": pid}, token=LITELLM_KEY)


@suite("peers")
def peers_suite(ctx: BenchContext) -> Iterator[list[Cell]]:
    """Portkey (and LiteLLM with --peers) on the server CPU, beside an Edge+Node on it."""
    levels = [c for c in ctx.options.concurrency or CONCURRENCY if c in CONCURRENCY]
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(edge_stack(ctx, ONE_CORE, one_core=True))]
        starters = {"portkey": _portkey}
        if getattr(ctx.options, "peers", False):
            starters["litellm"] = _litellm
        for name, start in starters.items():
            try:
                targets.append(start(ctx, stack))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                SKIPPED[name] = str(exc)
                print(f"peer {name} skipped: {exc}", file=sys.stderr)
        yield [Cell(t, mode, c) for mode in ("json", "stream") for c in levels for t in targets]
        _after_rounds(ctx, targets)


def _after_rounds(ctx: BenchContext, targets: list[Target]) -> None:
    """The cells that are not wrk runs, on the suite's targets while they are up."""
    direct = Target("upstream", ctx.upstream_port, {"upstream": ctx.upstream_pid})
    try:
        FRAMES.update(per_frame([direct, *targets], ctx.options.rounds))
    except (OSError, RuntimeError, TimeoutError) as exc:
        NOT_MEASURED.append(f"Per-frame delay: not measured ({type(exc).__name__}: {exc})")
    try:
        RATES.update(sustained(targets, ctx.options.seconds))
    except (OSError, RuntimeError) as exc:
        NOT_MEASURED.append(f"Sustained rate: not measured ({type(exc).__name__}: {exc})")
    MEASURED["sustained_rate"] = {
        name: {"sustained": search.sustained, "steps": [step.as_dict() for step in search.steps]}
        for name, search in RATES.items()
    }
    MEASURED["per_frame_us"] = {
        name: {what: round(frames.figure(what), 1) for what in ("p50", "p99", "mean")}
        for name, frames in FRAMES.items()
    }


def _added(f: Figures, key: tuple[str, str, int], metric: str) -> float | None:
    """``metric`` (p50 or ttfb50) of a cell minus the upstream-direct cell's, in ms."""
    base = ("upstream", key[1], key[2])
    if not (f.has(key) and f.has(base)):
        return None
    return f.median(key, metric) - f.median(base, metric)


def _cpu(f: Figures, key: tuple[str, str, int]) -> str:
    if not f.has(key):
        return "-"
    names = f.runs[key][0].cpu_ms
    return " + ".join(f"{name} {f.cpu(key, name):.2f}" for name in names)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


ROWS = ("edge", ONE_CORE, "portkey", "litellm", "proxy")


@section
def peers_table(f: Figures) -> list[str]:
    """Each gateway's req/s at c=16 and added latency at c=1, from the same rounds."""
    present = [t for t in ROWS if f.has((t, "json", 16)) or f.has((t, "json", 1))]
    ran = any(t in present for t in ("portkey", "litellm"))
    if not (ran or SKIPPED or RATES or FRAMES or NOT_MEASURED):
        return []
    lines = ["## Against other gateways (medians, same rounds)", ""]
    lines += [f"- {name}: {version}" for name, version in VERSIONS.items()]
    lines += [f"- {name} skipped: {why}" for name, why in SKIPPED.items()]
    lines += [
        "",
        "| gateway | req/s json c=16 | CPU ms/req json c=16 | added p50 json c=1 ms "
        "| added TTFB stream c=1 ms | added p50 stream c=1 ms |",
        "|---|---|---|---|---|---|",
    ]
    for t in present:
        rps = f.median((t, "json", 16), "rps") if f.has((t, "json", 16)) else None
        lines.append(
            f"| {t} | {_fmt(rps, 0)} | {_cpu(f, (t, 'json', 16))} | "
            f"{_fmt(_added(f, (t, 'json', 1), 'p50'))} | "
            f"{_fmt(_added(f, (t, 'stream', 1), 'ttfb50'))} | "
            f"{_fmt(_added(f, (t, 'stream', 1), 'p50'))} |"
        )
    lines += [
        "",
        f"`{ONE_CORE}` is an Edge and its Node both pinned to the CPU each peer has alone; "
        "`edge` is the core cells' Edge (its Node on the other CPU). Added = the cell's "
        "median minus the upstream-direct cell's.",
    ]
    if RATES:
        lines += ["", *render_rates(RATES)]
    if FRAMES:
        lines += ["", *render_frames(FRAMES)]
    return lines + [line for why in NOT_MEASURED for line in ("", why)]


@check
def peer_checks(f: Figures) -> list[Check]:
    """The targets against the peers (docs/performance.md), on medians of the same rounds."""
    out: list[Check] = []
    ours = ONE_CORE
    for mode, metric, what in (
        ("json", "p50", "added p50 at c=1, json"),
        ("stream", "ttfb50", "added first byte at c=1, stream"),
    ):
        mine, theirs = _added(f, (ours, mode, 1), metric), _added(f, ("portkey", mode, 1), metric)
        if mine is not None and theirs is not None:
            out.append(
                Check(
                    f"{what} ({ours}) vs Portkey",
                    f"{mine:.2f} vs {theirs:.2f} ms",
                    "<= Portkey's",
                    mine <= theirs,
                )
            )
    for metric, limit in (("p50", ADDED_P50_MS), ("p99", ADDED_P99_MS)):
        if (mine := _added(f, (ours, "json", 1), metric)) is not None:
            out.append(
                Check(f"added {metric} at c=1, json ({ours})", f"{mine:.2f} ms",
                      f"<= {limit} ms", mine <= limit)
            )  # fmt: skip
    for peer, factor in (("portkey", TIMES_PORTKEY), ("litellm", TIMES_LITELLM)):
        a, b = (ours, "json", 16), (peer, "json", 16)
        if f.has(a) and f.has(b):
            mine, theirs = f.median(a, "rps"), f.median(b, "rps")
            ratio = mine / theirs if theirs else float("inf")
            out.append(
                Check(
                    f"json c=16 req/s on one core vs {peer}",
                    f"{ratio:.2f}x ({mine:.0f} vs {theirs:.0f})",
                    f">= {factor:g}x",
                    ratio >= factor,
                )
            )
    if f.has((ours, "json", 16)):
        edge, node = f.cpu((ours, "json", 16), "edge"), f.cpu((ours, "json", 16), "node")
        out.append(
            Check(f"Edge (Node) CPU per json request, c=16 ({ours})",
                  f"{edge:.2f} ms (Node {node:.2f} ms)",
                  f"<= {EDGE_CPU_MS:.2f} ms (Node <= {NODE_CPU_MS:.2f} ms)",
                  edge <= EDGE_CPU_MS and node <= NODE_CPU_MS)
        )  # fmt: skip
    if ours in RATES and "portkey" in RATES:
        mine, theirs = RATES[ours].sustained, RATES["portkey"].sustained
        out.append(
            Check("sustained req/s at p99 < 20 ms on one core vs Portkey",
                  f"{mine:.0f} vs {theirs:.0f}", ">= Portkey's", mine >= theirs)
        )  # fmt: skip
    if ours in FRAMES and "upstream" in FRAMES:
        # judged on the mean gap: events arrive several to a read, so the median gap is 0
        # through every target (docs/performance.md)
        mean = FRAMES[ours].figure("mean") - FRAMES["upstream"].figure("mean")
        p50 = FRAMES[ours].figure("p50") - FRAMES["upstream"].figure("p50")
        out.append(
            Check(f"added delay per streamed frame ({ours})",
                  f"mean {mean:.1f} µs (median gap {p50:+.1f} µs)", f"<= {FRAME_ADDED_US:g} µs",
                  mean <= FRAME_ADDED_US)
        )  # fmt: skip
    return out
