"""What ``iop-node`` does (nodes.agent.main starts it): ``--config node.yaml`` runs a Node
until SIGTERM/SIGINT, then exits 0; ``keygen --out DIR`` makes the Node's recipient key pair
(nodes.agent.keygen)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from nodes.agent import __version__
from nodes.agent.client import NodeClient
from nodes.agent.config import NodeConfig, NodeConfigError, load_config
from nodes.agent.credentials import load_opener
from nodes.agent.keygen import keygen
from nodes.agent.policy_argv import start_notes
from nodes.agent.secrets import SecretError, resolve_secret
from nodes.envelope import KeyFileError, KeyFileExposed
from nodes.heap import settle_heap
from nodes.loop import LoopChoiceError
from nodes.loop import install as install_loop
from obskit.context import NODE
from obskit.logs import LogFormatError, configure, json_line, log_format
from obskit.otel import Tracing, TracingConfigError, start_tracing
from secretref.keyfiles import PrivateFileError, check_private

log = logging.getLogger("iop_node")
DESCRIPTION = (
    "iop-node --config node.yaml: run a Node until SIGTERM/SIGINT, then exit 0. "
    "iop-node keygen --out DIR: make the Node's recipient key pair."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iop-node", description=DESCRIPTION)
    parser.add_argument("--config", required=True, help="path to node.yaml")
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight runs may finish before they fail (default 10)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="DEBUG, INFO (default), WARNING, ERROR or CRITICAL, in any case",
    )
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("--version", action="version", version=f"iop-node {__version__}")
    return parser


async def _run(config: NodeConfig, grace_s: float, tracing: Tracing | None) -> None:
    client = NodeClient(config, shutdown_grace_s=grace_s, tracing=tracing)
    settle_heap()  # the collector's pauses were the long tail (docs/performance-history.md)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, client.stop)
    await client.run()


def _refuse(fmt: str, reason: str, code: int = 2) -> int:
    """Why the Node does not start, on stderr (one JSON line with LOG_FORMAT=json); exit
    ``code`` (2: an invalid config)."""
    print(json_line("ERROR", log.name, reason) if fmt == "json" else reason, file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keygen"]:
        return keygen(argv[1:])
    args = _parser().parse_args(argv)
    try:  # R-OBS-4: from the first line on, every line is in the chosen format
        fmt = log_format(os.environ)
    except LogFormatError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:  # uvloop unless IOP_EVENT_LOOP=asyncio (docs/performance.md)
        loop_name = install_loop()
    except LoopChoiceError as exc:
        return _refuse(fmt, str(exc))
    try:
        config = load_config(args.config)
        if config.tls is not None and config.tls.key_file is not None:
            check_private(config.tls.key_file, "tls.key_file")
        if config.credential_plane is not None:  # R-AUTH-4: the keys must load at start
            load_opener(config.credential_plane)
    except (KeyFileExposed, PrivateFileError) as exc:  # R-TLS-5: one line, the fix, exit 1
        return _refuse(fmt, str(exc), 1)
    except (NodeConfigError, KeyFileError) as exc:
        return _refuse(fmt, str(exc))
    try:  # a Node without its token could only be refused, again and again
        resolve_secret(config.token.as_secret_ref(), what="token")
    except SecretError as exc:
        return _refuse(fmt, f"{args.config}: {exc}")
    notes = start_notes(config.policy.commands) if config.policy is not None else []
    if args.check:
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        print(f"{args.config}: ok")
        return 0
    try:  # R-OBS-2: only when OTEL_* asks for traces
        tracing = start_tracing("iop-node")
    except TracingConfigError as exc:
        return _refuse(fmt, str(exc))
    configure(fmt, args.log_level, sys.stderr)
    NODE.set(config.node_id)  # every task of the Node inherits it (its log lines name it)
    log.info("iop-node %s starting (node %s, %s loop)", __version__, config.node_id, loop_name)
    for note in notes:  # R-TLS-6: what a commands entry grants, said once at start
        log.warning("%s", note)
    try:
        asyncio.run(_run(config, args.shutdown_grace, tracing))
    finally:
        if tracing is not None:
            tracing.shutdown()  # bounded: a hanging collector does not hold the exit
    return 0
