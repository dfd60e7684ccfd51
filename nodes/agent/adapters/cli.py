"""Normalized execution by a local command: the prompt on stdin, stdout as the answer.

No shell: ``provider.command`` is an argv list. The command sees only a fixed base
environment (``secretref.envnames.BASE_NAMES``: PATH, HOME, locale, temp dirs...) plus the
names its provider declares: ``provider.env`` resolved here and, in managed mode, the run's
slot secret in ``provider.credential_env`` (R-MGD-11, never in argv). The node token and
every other secret of the Node's own environment never reach it (R-TLS-3). Every program
this module starts, run or probe, passes the Node's policy check first (``Gate``), and runs
in a private directory made for that one start (empty, 0700, removed after; R-TLS-8), never
in the Node's own working directory.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import math
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

from nodes.agent.adapters.base import AdapterError, Emit, RunSpec, parse_json_body, send
from nodes.agent.adapters.sse import DONE, ChatChunks, chat_completion
from nodes.agent.limits import DEFAULT_LIMITS, Limits
from nodes.agent.policy import Gate, PolicyRefused, Use, declared_env, require
from nodes.agent.secrets import redact, resolve_secret
from nodes.wire import PHASE_CONNECT, ProviderPayload, Usage
from secretref.envnames import BASE_NAMES, BASE_PREFIXES

_CHAT_OPERATIONS = {"chat", "chat_completions"}
CLI_FAILED = "the CLI program failed"  # what the Edge hears; the detail stays in the Node's log
_STDERR_TAIL = 4096
_READ_SIZE = 64 * 1024


def base_env() -> dict[str, str]:
    """The part of the Node's environment a command may see (R-TLS-3)."""
    return {k: v for k, v in os.environ.items() if k in BASE_NAMES or k.startswith(BASE_PREFIXES)}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def render_prompt(messages: Any) -> str:
    """One message: its text as is. Several: a transcript of ``Role: text`` blocks
    separated by blank lines, in order, so the last user message comes last."""
    items = [
        (str(m.get("role", "user")), _text(m.get("content")))
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict)
    ]
    items = [(role, text) for role, text in items if text]
    if len(items) == 1:
        return items[0][1]
    return "\n\n".join(f"{role.capitalize()}: {text}" for role, text in items)


def _estimate(text: str) -> int:
    return math.ceil(len(text) / 4)


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill the command and anything it started (its own process group, R-TLS-4), also
    after the command itself exited: a child it left behind is still in the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            proc.kill()


RUN_DIR_PREFIX = "iop-run-"


@contextlib.asynccontextmanager
async def run_directory() -> AsyncIterator[str]:
    """A fresh empty directory only the Node's user can enter (``mkdtemp``: 0700, under the
    Node's TMPDIR), removed with whatever the program left in it (R-TLS-8), on a worker
    thread: a program that left many files does not stall the Node's loop (and a cancelled
    run's thread still finishes the removal)."""
    path = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX)
    try:
        yield path
    finally:
        await asyncio.to_thread(shutil.rmtree, path, onerror=_writable_and_retry)


def exec_argv(argv: list[str]) -> list[str]:
    """The argv to exec from the run directory: a relative program path (``./tool``, checked
    by the policy as written) still names the file beside the Node's own working directory."""
    program = argv[0]
    if os.sep in program and not os.path.isabs(program):
        return [os.path.abspath(program), *argv[1:]]
    return argv


def _writable_and_retry(func: Callable[..., Any], path: str, _exc: Any) -> None:
    """A program may leave a directory it made read-only: open it up, then remove again."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IRWXU)
            shutil.rmtree(path, ignore_errors=True)
        else:
            func(path)


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Learns the moment the command exits. ``Process.wait()`` also waits for every pipe
    to close, which a child that inherited stdout can delay forever."""

    def __init__(self, exited: asyncio.Future[None], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_READ_SIZE, loop=loop)
        self._exited = exited

    def process_exited(self) -> None:
        super().process_exited()
        if not self._exited.done():
            self._exited.set_result(None)


async def _spawn(
    command: list[str], env: dict[str, str], cwd: str
) -> tuple[asyncio.subprocess.Process, asyncio.Future[None]]:
    """``create_subprocess_exec`` in its own process group, plus a future set at exit."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitProtocol(exited, loop),
        *exec_argv(command),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,  # its own process group, killed as a whole
    )
    return asyncio.subprocess.Process(transport, protocol, loop), exited


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()


async def _tail(stream: asyncio.StreamReader) -> bytes:
    tail = b""
    while chunk := await stream.read(_READ_SIZE):
        tail = (tail + chunk)[-_STDERR_TAIL:]
    return tail


class CliAdapter:
    """Runs ``provider.command`` once per request, and ``provider.probe_command`` as its probe."""

    def __init__(
        self, provider: ProviderPayload, limits: Limits = DEFAULT_LIMITS, gate: Gate | None = None
    ) -> None:
        if not provider.command:
            raise ValueError(f"provider {provider.id}: the cli adapter needs a command")
        self.provider = provider
        self.limits = limits
        self._gate = gate or Gate()
        self._command = list(provider.command)
        extra = {
            name: resolve_secret(ref, what=f"provider {provider.id} env {name}")
            for name, ref in provider.env.items()
        }
        self.env = base_env() | extra  # what its probe sees; a run may add its slot secret
        self._secrets = tuple(extra.values())

    def _run_env(self, credential: str | None) -> dict[str, str]:
        name = self.provider.credential_env
        if credential is None or name is None:
            return self.env
        return {**self.env, name: credential}  # R-MGD-11: this run's process only

    def _check(self, what: str, argv: list[str], *, probe: bool = False) -> None:
        """R-TLS-3: the exact argv and the declared names, checked at every start."""
        names = declared_env(self.provider, probe=probe)
        require(self._gate, self.provider, Use.program(what, argv, names))

    async def probe(self) -> tuple[bool, str]:
        """R-HEALTH-3: run ``probe_command`` (no stdin, output dropped, no slot secret,
        R-MGD-10); exit status 0 is healthy."""
        argv = list(self.provider.probe_command or ())
        try:
            self._check("probe command", argv, probe=True)
        except PolicyRefused as exc:
            return False, str(exc)
        async with run_directory() as cwd:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *exec_argv(argv),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                    env=self.env,
                    cwd=cwd,
                    start_new_session=True,  # its own process group, killed as a whole
                )
            except OSError as exc:
                return False, f"cannot start the probe command: {exc.strerror}"
            try:
                code = await proc.wait()
            finally:
                kill_group(proc)  # on a timeout the probe and anything it started go
                await proc.wait()  # reap: no zombies
        return (True, "") if code == 0 else (False, f"probe command exited with code {code}")

    async def run(self, request: RunSpec, emit: Emit) -> Usage | None:
        if request.operation not in _CHAT_OPERATIONS:
            raise AdapterError(
                "bad_request",
                "the provider does not serve this operation",
                detail=f"provider {self.provider.id} does not serve operation {request.operation}",
            )
        env = self._run_env(request.credential)
        try:
            self._check("command", self._command)
        except PolicyRefused as exc:
            raise AdapterError(
                "upstream_error", CLI_FAILED, detail=str(exc), phase=PHASE_CONNECT
            ) from None
        body = parse_json_body(request.body)
        prompt = render_prompt(body.get("messages"))
        model = str(body.get("model") or self.provider.id)
        async with run_directory() as cwd:
            return await self._run_in(cwd, env, request, prompt, model, emit)

    async def _run_in(
        self, cwd: str, env: dict[str, str], request: RunSpec, prompt: str, model: str, emit: Emit
    ) -> Usage:
        try:
            proc, exited = await _spawn(self._command, env, cwd)
        except OSError as exc:
            raise AdapterError(  # like a refused connection (R-HEALTH-1)
                "upstream_error",
                CLI_FAILED,
                detail=f"cannot start {self._command[0]}: {exc.strerror}",
                retryable=True,
                phase=PHASE_CONNECT,
            ) from None
        # The run ends when the command exits: whatever it left running is killed then, so
        # a child holding stdout open cannot keep the run (or the Node) waiting (R-TLS-4).
        exited.add_done_callback(lambda _: kill_group(proc))
        timeout = self.provider.run_timeout_s or self.limits.cli_run_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(proc, exited, request, prompt, model, emit)
        except TimeoutError:
            raise AdapterError(  # retryable unless output went out (the router decides)
                "upstream_timeout",
                f"the CLI program did not finish within {timeout:g}s",
                retryable=True,
            ) from None
        finally:
            kill_group(proc)
            await proc.wait()  # reap: no zombies, whatever ended the run

    async def _exchange(
        self,
        proc: asyncio.subprocess.Process,
        exited: asyncio.Future[None],
        request: RunSpec,
        prompt: str,
        model: str,
        emit: Emit,
    ) -> Usage:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        feeder = asyncio.create_task(_feed(proc.stdin, prompt.encode()))
        stderr = asyncio.create_task(_tail(proc.stderr))
        cap, size = self.limits.cli_max_output_bytes, 0
        try:
            chunks = ChatChunks(request.run_id, model)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            output: list[str] = []
            while data := await proc.stdout.read(_READ_SIZE):
                size += len(data)
                if size > cap:
                    raise AdapterError(
                        "upstream_error",
                        f"the CLI program's output is over {cap} bytes "
                        "(limits.cli_max_output_bytes)",
                    )
                text = decoder.decode(data)
                if text:
                    output.append(text)
                    if request.stream:
                        await send(emit, chunks.delta(text))
            tail_text = decoder.decode(b"", final=True)
            if tail_text:
                output.append(tail_text)
                if request.stream:
                    await send(emit, chunks.delta(tail_text))
            await exited
            code = await proc.wait()  # stdout ended: the group is gone, the pipes closed
            err = await stderr
        finally:
            feeder.cancel()
            stderr.cancel()
        if code != 0:
            slot = (request.credential,) if request.credential else ()
            tail = redact(err.decode("utf-8", errors="replace").strip(), self._secrets + slot)
            detail = f": {tail[-300:]}" if tail else ""
            raise AdapterError(  # like an upstream 5xx; not retried once output went out
                "upstream_error",
                CLI_FAILED,
                detail=f"command exited with code {code}{detail}",
                retryable=True,
            )
        text = "".join(output)
        usage = Usage(input_tokens=_estimate(prompt), output_tokens=_estimate(text), estimated=True)
        if request.stream:
            await send(emit, chunks.finish("stop") + chunks.usage(usage) + DONE)
        else:
            message = {"role": "assistant", "content": text}
            await send(emit, chat_completion(request.run_id, model, message, "stop", usage))
        return usage

    async def aclose(self) -> None:
        """Each run owns its process; nothing shared to close."""
