"""Test support: every shared helper and harness, defined once. Fake peers (upstream servers,
a CLI tool, the Edge side of the wire) live in ``tests.fakes``.

Modules
-------
``stack``
    ``Stack``: one real Edge (runedge under daphne), real ``iop-node`` Nodes and fake
    upstreams, all on 127.0.0.1, each Stack isolated under its own directory (config files,
    a SQLite database copied from a template migrated once per session, logs). Share one per
    module where tests do not interfere; end each test with ``stack.wait_idle()``.

    ``Stack(directory, *, upstreams=..., providers=..., models=..., nodes=None, openai=None,
    edge=None, pool=None, profiles=None, credential_plane=None, env=None, log_level="INFO")``:
    ``upstreams`` maps a name to a fake kind; ``"{up:NAME}"`` inside provider definitions
    becomes that upstream's URL. ``providers`` belong to the one default node ``node-1``;
    ``nodes=[{"id": ..., "providers": [...], "config": {...}, "recipient": {...}}, ...]`` for
    more, ``config`` being extra node.yaml keys (``tls``, ``policy``, ``limits``,
    ``credential_plane``; ``"{up:NAME}"`` there is the upstream's ``http://host:port``) and
    ``recipient`` the node's ``credential_recipient``. ``openai``, ``edge``, ``pool``
    (``provider_pool``), ``profiles`` (``protocol_profiles``) and ``credential_plane`` are
    merged into the Edge config (``edge={"tls": ...}`` makes the Nodes dial ``wss://``,
    ``openai={"tls": ...}`` makes ``openai_url`` https); ``env`` is extra environment for the
    Edge and the Nodes; ``principals`` is the top-level ``principals:`` list (R-MGD-13).
    ``start()`` (or ``with Stack(...)``) returns once every provider is online;
    ``start(wait_online=False)`` does not wait.

    ``openai_url``, ``v1_url``, ``control_url`` (the control listener on ``admin.listen``),
    ``token`` (the raw client token; token_ref ``app-test``, principal_ref ``team-test``),
    ``config_path``, ``upstream(name)``, ``pool_snapshot()``, ``provider(provider_id)``,
    ``metrics()`` / ``metrics_text()`` (the control listener's ``/metrics``),
    ``wait_until(done, timeout, what)`` (polls ``/pool``), ``await until(done, what, within)``
    (the same, off the event loop), ``wait_online()``, ``wait_idle()`` (every counter 0),
    ``kill_node(index)``, ``restart_node(index)``, ``reset_upstreams()``, ``clean_slate()``,
    ``create_superuser(username, password)`` (in the Edge's own database),
    ``manage(*args, stdin=b"")`` (a ``manage.py`` command on that database), ``logs()``,
    ``refresh(mode, document) -> (status, report)`` (``POST /refresh``),
    ``send_chat(model, stream=False, token=None) -> HTTPConnection`` (sent, not read),
    ``stop()``.
    ``provider_row(snapshot, provider_id)``: a provider's row of a snapshot.
``cluster``
    ``Cluster(directory, *, database_url, edges=2, redis_url=None, lease_ttl_s=2.0,
    revision_poll_s=0.2, **stack_kwargs)``: a ``Stack`` with N Edges (ids ``edge-i``, own
    ports via the runedge flags) on a new PostgreSQL database (dropped at ``stop()``) and one
    config document; every Node lists every Edge (``edge_urls``), the k-th starting at Edge
    k mod N. With ``redis_url`` (``scale_out_redis_url()``: ``IOP_TEST_REDIS_URL`` when the
    build can run scale-out) the Edges run in scale-out mode under a random key prefix
    (deleted at ``stop()``). ``edges[i]`` (``openai_url``, ``control_url``, ``node_url``,
    ``pool_snapshot()``), ``edge_of(node_id)`` (from the Node's log), ``chat(i)``,
    ``kill_edge(i)``, ``start_edge(i)``, ``database_url``. ``scripts/scale_local.py`` runs it.
``processes``
    ``ROOT``, ``sha256_hex(text)``, ``child_env()``, ``Proc``, the migrated database template.
``ports``
    ``free_port()``: a loopback port for one listener, never handed out twice in a process,
    locked against parallel test processes (a shared lock file), outside the kernel's
    ephemeral range and bindable when handed out.
``pids``
    ``alive(pid)``, ``reaped(pid)``, ``await wait_exit(pid)``: process checks via /proc and
    pidfd, for tests that kill commands.
``upstream_loop``
    ``FakeUpstream(kind)``: a fake upstream from ``tests.fakes`` on its own event loop in a
    thread, so sync tests (the official SDKs) can drive it (``.server``, ``.url``,
    ``.reset()``, ``.wait_disconnect(timeout)``, ``.call(coroutine)``). ``Hold(upstream)``
    holds every streamed response after its first chunk: ``wait_streaming()``,
    ``release()``.
``inprocess``
    No processes: ``Runtime`` (a real pool and NodeHub), ``FakeNode`` (plays a Node on it),
    ``Call`` (drives an ASGI app as daphne does), ``await until(predicate)``, and the
    in-process test document ``document()``, ``api()``, ``chat()``.
``node_agent``
    ``running_node(edge, tmp_path)``: the Node agent in-process against a
    ``tests.fakes.edge.FakeEdge``; ``node_config``.
``payloads``
    Node payloads and request bodies: ``openai_provider``, ``ollama_provider``,
    ``cli_provider``, ``node_payload``, ``chat_body``.
``config`` / ``config_examples``
    ``load_issues(document)``, ``provider(document, provider_id)``, ``Doc``;
    ``example_document()`` and the example Node token.
``pools``
    ``prov(...)``, ``ready_pool(*providers, ...)``, ``await enqueue(pool)`` for engine tests.
``translation``
    ``translation_stack(directory)``: an Edge with a Chat, a GLM, an Ollama, an Anthropic
    and a CLI provider and model groups with and without ``translate`` (R-XLATE-1);
    ``metric(stack, name, **labels)``: a summed sample of ``/metrics``.
``edge``
    The ``edge`` fixture (import ``attached_edge``): an in-process EdgeRuntime started from
    configs/edge.yaml and attached as the running Edge the admin and REST API reach;
    ``capacity_edit(edge, capacity)``: the running document with a live edit.
``browser``
    ``browser_page(test_ca=False)``: headless Debian Chromium via Playwright (``test_ca``
    accepts a ``tls.Pki`` certificate); ``admin_login(page, user, password)``;
    ``NEEDS_CHROMIUM`` (marks that skip where it is missing).
``fixtures``
    The shared fixtures (``http``, ``oai``, ``ant``, the fake upstreams) and
    ``shared_stack(name, options)``: a module's one ``stack`` and the autouse fixture that
    wraps each test in ``clean_slate()``, for modules that inject upstream faults.
``journeys`` / ``doc_pages``
    Docs run as written: ``doc_blocks(page, tag, lang)`` (tagged blocks by name),
    ``source_checkout(dir)`` (a fresh copy of the tracked files), ``JourneyEdge`` for
    docs/journeys.md; ``Machine`` (a fresh checkout with its own ``/etc/iop``) and
    ``DocPage(page, tag, substitutions)`` (``run``, ``write``, ``start``, ``install_edge``,
    placeholders filled from earlier output) for pages set up across machines.
``clock``
    ``Clock``: a hand-driven clock.
``metering``
    ``record_factory(**defaults)``: usage records.
``tls``
    ``self_signed(...)`` and ``Pki(directory)``: certificates minted in the test (a CA, an
    Edge certificate for loopback, Node client certificates, and expired, self-signed,
    wrong-name and wrong-CA ones).
``managed``
    ``mint_keys(directory, node_id) -> ManagedKeys``: the issuer and a Node's recipient key
    pair as ``iop_keys`` writes them; ``.node_plane()`` (node.yaml ``credential_plane``),
    ``.envelope(secret, binding, ...)`` (issued as the Edge issues it);
    ``managed_stack(directory, pki, keys, **options)``: a managed-mode ``Stack`` over TLS
    (GLM General and Coding Plan providers, groups ``glm`` and ``coder``, its keyring made).
"""

from tests.support.ports import free_port
from tests.support.processes import ROOT, sha256_hex
from tests.support.stack import (
    PRINCIPAL_REF,
    TOKEN_REF,
    Stack,
    messages_profile,
    provider_row,
    token_entries,
)
from tests.support.upstream_loop import FakeUpstream

__all__ = [
    "PRINCIPAL_REF",
    "ROOT",
    "TOKEN_REF",
    "FakeUpstream",
    "Stack",
    "free_port",
    "messages_profile",
    "provider_row",
    "sha256_hex",
    "token_entries",
]
