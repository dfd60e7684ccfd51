"""End-to-end stack for black-box tests: a real Edge under daphne, real Nodes, fake upstreams.

Everything listens on 127.0.0.1. One ``Stack`` is one isolated Edge: its own config files,
SQLite database (copied from a template migrated once per test session), var dir and log
files under the directory it is given. Share one Stack per module where tests do not
interfere; every test should end with ``stack.wait_idle()``.

API
---
Modules: ``stack`` (Stack), ``upstream`` (FakeUpstream), ``processes`` (child processes,
the database template), ``inprocess`` (no processes: ``Runtime`` with a real pool and
NodeHub, ``FakeNode`` playing a Node on it, ``Call`` driving an ASGI app the way daphne does).

``ROOT``: the project directory.

``free_port() -> int``
    A TCP port on 127.0.0.1 that was free a moment ago.

``messages_profile(upstream="main") -> dict``
    A ``protocol_profiles`` entry for an Anthropic Messages provider on a fake upstream.

``FakeUpstream(kind)``
    A fake upstream from ``tests.fakes`` (``"openai"``: chat/responses/messages/count_tokens/
    models; ``"ollama"``) serving on its own event loop in a background thread, so sync
    tests (the official SDKs) can drive it. ``.server`` is the ``FakeServer`` (``faults``,
    ``requests``, ``reply_text``...), ``.url`` its base URL, ``.reset()`` clears requests and
    faults, ``.wait_disconnect(timeout) -> bool`` waits until a client left mid-response,
    ``.call(coroutine)`` runs a coroutine on its loop.

``Stack(directory, *, upstreams=..., providers=..., models=..., nodes=None, openai=None,
pool=None, profiles=None, env=None, log_level="INFO")``
    ``upstreams`` maps a name to a fake kind; any string ``"{up:NAME}"`` inside provider
    definitions becomes that upstream's URL. ``providers`` are the providers of the one
    default node ``node-1``; pass ``nodes=[{"id": ..., "providers": [...]}, ...]`` for more.
    ``openai``, ``pool`` (``provider_pool``) and ``profiles`` (``protocol_profiles``) are
    merged into the Edge config; ``env`` is extra environment for the Edge and the Nodes
    (provider credentials by ``{env: NAME}``). ``start()`` (or ``with Stack(...)``) starts
    upstreams, the Edge, then the Nodes, and returns once every provider is online.

    ``openai_url`` (``http://127.0.0.1:P``), ``v1_url`` (``.../v1``), ``admin_url``,
    ``token`` (the raw client token; the config holds its sha256, token_ref ``app-test``,
    principal_ref ``team-test``), ``config_path``, ``upstream(name)``,
    ``pool_snapshot() -> dict``, ``provider(provider_id) -> dict``,
    ``wait_until(done, timeout)`` (polls ``/pool`` until ``done(snapshot)``),
    ``wait_online(timeout)``, ``wait_idle(timeout)`` (every counter 0, queue empty; raises
    after ``timeout``), ``kill_node(index=0)`` (SIGKILL), ``restart_node(index=0)``,
    ``logs() -> str`` (Edge and Node logs so far), ``stop()``; ``ports`` (role -> port),
    ``dir``, and ``edge`` / ``nodes`` (child processes, ``.popen`` while running).
"""

from tests.harness.processes import ROOT, free_port, sha256_hex
from tests.harness.stack import PRINCIPAL_REF, TOKEN_REF, Stack, messages_profile
from tests.harness.upstream import FakeUpstream

__all__ = [
    "PRINCIPAL_REF",
    "ROOT",
    "TOKEN_REF",
    "FakeUpstream",
    "Stack",
    "free_port",
    "messages_profile",
    "sha256_hex",
]
