"""docs/credentials.md ("Setup from zero on two machines") and docs/node.md ("TLS across two
machines") run as written: every tagged command block and file, in page order, on two
"machines" (directories, each a fresh copy of the checkout with its own ``/etc/iop``), with
real processes over TLS. ``tests.support.doc_pages`` is the runner.

What the test changes, and nothing else:

- ports: the pages' 7700, 7701, 8080 and 8443 become free ports (the control listener's
  default 7701 through the documented ``IOP_ADMIN_LISTEN``), 11434 a free port;
- host names: ``edge.example.com`` becomes ``localhost`` and ``10.0.0.5`` ``127.0.0.1``
  (both machines are this one), so the certificate the page mints names what the Node dials;
- ``/etc/iop`` lives under each machine's directory; the GLM API's URL in credentials.md's
  config becomes a loopback fake OpenAI-compatible upstream, and ``$GLM_API_KEY`` a test
  secret;
- ``<placeholders>`` get what the page's ``iop_token`` printed, as the reader pastes it, and
  the page's "copy to the other machine" prose is done by the test (the files it names);
- the Edge install: the pages' ``python3 -m venv .venv`` and ``pip install -e '.[edge]'``
  are the Makefile's own install, so the project's ``.venv`` (made by exactly that line)
  stands for them; every other line of that block (``migrate``) runs as written, on a new
  SQLite database under the fresh checkout's ``var/``. docs/node.md's Node install
  (``pip install .``) runs for real on its Node machine (against a local mirror of the
  package index, tests/support/wheelhouse.py); credentials.md's Node, which that
  page says to install from docs/node.md, uses the project's ``.venv`` (it has ``iop-node``).
"""

from __future__ import annotations

import json
import re
import ssl
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.doc_pages import DocPage, Machine, copy
from tests.support.journeys import COMMAND_TIMEOUT_S, wait_for
from tests.support.ports import free_port
from tests.support.processes import ROOT
from tests.support.upstream_loop import FakeUpstream
from tests.support.wheelhouse import DOWNLOAD_TIMEOUT_S, package_index

pytestmark = pytest.mark.slow

SECRET = "sk-docs-page-glm-7c41e0"
READY_TIMEOUT_S = 60.0


def printed(output: str, label: str) -> str:
    """The value after ``label:`` in a command's output (what the reader copies)."""
    match = re.search(rf"^\s*{label}:\s*(\S+)$", output, re.MULTILINE)
    assert match, f"no {label} in:\n{output}"
    return match.group(1)


def ready(log: Path, proc_alive: Callable[[], bool]) -> str:
    """Wait for the Edge's ready line; the log so far."""
    wait_for(
        lambda: "IOP Edge ready" in log.read_text(errors="replace"),
        READY_TIMEOUT_S,
        "the Edge ready",
        check=proc_alive,
        log=lambda: log.read_text(errors="replace")[-4000:],
    )
    return log.read_text(errors="replace")


def pool(admin_port: int) -> dict:
    with httpx.Client(timeout=5) as client:
        return client.get(f"http://127.0.0.1:{admin_port}/pool").json()  # type: ignore[no-any-return]


def online(snapshot: dict, provider_id: str) -> bool:
    return any(p["provider_id"] == provider_id and p["online"] for p in snapshot["providers"])


def carry_tls(edge: Machine, node: Machine, token: str) -> Path:
    """The pages' "copy to the Node machine": the CA, gpu-1's client certificate and key
    (0600) and the token ``iop_token`` printed (0600), into the Node's ``/etc/iop``; the
    Edge's pki directory."""
    pki = edge.etc / "pki"
    copy(pki / "ca.crt", node.etc)
    copy(pki / "node-gpu-1.crt", node.etc)
    copy(pki / "node-gpu-1.key", node.etc, mode=0o600)
    path = node.etc / "node.token"
    path.write_text(token)
    path.chmod(0o600)
    return pki


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[list[Machine]]:
    made: list[Machine] = []
    yield made
    for machine in made:
        machine.stop()


def test_credentials_page_sets_up_managed_mode_on_two_machines_as_written(
    tmp_path: Path, machines: list[Machine]
) -> None:
    """R-AUTH-3..6, R-MGD-1..5: install, migrate, keys, configs, the Edge (``IOP_HTTPS=1``,
    no warning), the managed Node, the slot and the route, all as the page prints them; then
    the route key calls the model over https, the upstream gets exactly the slot secret, and
    a caller's own ``X-IOP-Provider-Authorization`` is refused as the page says."""
    upstream = FakeUpstream("openai")
    try:
        edge_port, openai_port, admin_port = free_port(), free_port(), free_port()
        page = DocPage(
            ROOT / "docs" / "credentials.md",
            "credentials",
            {
                ":7700": f":{edge_port}",
                ":8080": f":{openai_port}",
                "edge.example.com": "localhost",
                "https://open.bigmodel.cn/api/paas/v4": upstream.url + "/v1",
            },
        )
        edge_env = {"IOP_ADMIN_LISTEN": f"127.0.0.1:{admin_port}", "GLM_API_KEY": SECRET}
        edge = Machine("edge", tmp_path, edge_env)
        node = Machine("node", tmp_path)
        machines += [edge, node]

        node.link_project_venv()  # the Node installed, as step 1 asks
        keygen = page.run("node-keygen", node)
        page.filled["<the key id keygen printed>"] = printed(keygen, "recipient_key_id")
        assert stat.S_IMODE((node.etc / "recipient.key").stat().st_mode) == 0o600
        copy(node.etc / "recipient.pub", edge.etc, "gpu-1.pub")  # "copy ... to the Edge"
        assert "Applying" in page.install_edge("edge-install", edge)  # migrate, as written
        keys = page.run("edge-keys", edge)
        page.filled["<the sha256 printed by iop_token>"] = printed(keys, "sha256")
        # Step 2, "copy to the Node machine": the files it names.
        pki = carry_tls(edge, node, printed(keys, "token"))
        copy(edge.etc / "issuer.pub", node.etc)
        assert not (edge.etc / "recipient.key").exists()  # the private key never left
        assert stat.S_IMODE((edge.etc / "keyring.json").stat().st_mode) == 0o600

        page.write("edge.yaml", edge)
        page.write("node.yaml", node)
        edge_proc = page.start("edge-start", edge, tmp_path)
        log = ready(edge_proc.log, edge_proc.alive)
        assert "IOP_HTTPS is not set" not in log
        assert f"https://0.0.0.0:{openai_port}" in log
        page.start("node-start", node, tmp_path)
        route = page.run("slot-and-route", edge)
        key = printed(route, "key")
        wait_for(lambda: online(pool(admin_port), "glm-general"), READY_TIMEOUT_S, "gpu-1")
        # The commands ran as their own processes: the Edge's route table takes them at its
        # next version poll (docs/credentials.md, "Live changes and rotation").
        wait_for(
            lambda: pool(admin_port)["credential_table"]["routes"] == 1,
            READY_TIMEOUT_S,
            "the route in the Edge's route table",
        )

        verify = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        base = f"https://localhost:{openai_port}/v1"
        with openai.OpenAI(
            base_url=base, api_key=key, http_client=httpx.Client(verify=verify), max_retries=0
        ) as client:
            reply = client.chat.completions.create(
                model="glm", messages=[{"role": "user", "content": "hi"}]
            )
        assert reply.choices[0].message.content
        auth = [r.headers.get("authorization") for r in upstream.server.requests]
        assert auth == [f"Bearer {SECRET}"]
        with httpx.Client(verify=verify, timeout=20) as client:
            refused = client.post(
                base + "/chat/completions",
                headers={
                    "Authorization": f"Bearer {key}",
                    "X-IOP-Provider-Authorization": "Bearer sk-callers-own",
                },
                json={"model": "glm", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "provider_credential_refused"
    finally:
        upstream.stop()


# Its Node install runs pip for real (its block's own bound: COMMAND_TIMEOUT_S x 5), after
# the session's one download from the package index (tests/support/wheelhouse.py).
@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + COMMAND_TIMEOUT_S * 5 + 120)
def test_node_tls_walkthrough_runs_as_written_on_two_machines(
    tmp_path: Path, machines: list[Machine]
) -> None:
    """R-TLS-1..3: install, migrate, a local CA and certificates, the Edge over TLS with
    mutual TLS for Nodes (``IOP_HTTPS=1``), the policy printed for the Node, the Node-only
    install on its machine, its ``--check`` and start over ``wss://``: its provider online in
    the Edge's ``/pool``, all as the page prints it."""
    edge_port, openai_port, admin_port = free_port(), free_port(), free_port()
    page = DocPage(
        ROOT / "docs" / "node.md",
        "node-tls",
        {
            ":7700": f":{edge_port}",
            ":8443": f":{openai_port}",
            ":7701": f":{admin_port}",
            ":11434": f":{free_port()}",
            "edge.example.com": "localhost",
            "10.0.0.5": "127.0.0.1",
        },
    )
    edge = Machine("edge", tmp_path, {"IOP_ADMIN_LISTEN": f"127.0.0.1:{admin_port}"})
    node = Machine("node", tmp_path)
    machines += [edge, node]

    assert "Applying" in page.install_edge("edge-install", edge)
    page.run("certs", edge)
    minted = page.run("token", edge)
    page.filled["<the sha256 iop_token printed>"] = printed(minted, "sha256")
    page.write("edge.yaml", edge)
    edge_proc = page.start("edge-start", edge, tmp_path)
    log = ready(edge_proc.log, edge_proc.alive)
    assert f"edge=wss://0.0.0.0:{edge_port}" in log and "IOP_HTTPS is not set" not in log
    policy = (edge.checkout / "gpu-1-policy.yaml").read_text()
    assert "127.0.0.1:" in policy

    started = time.monotonic()
    node.env.update(package_index())  # a local mirror (tests/support/wheelhouse.py)
    page.run("node-install", node)  # the Node-only install, for real
    assert not (node.checkout / ".venv" / "bin" / "manage.py").exists()
    install_s = time.monotonic() - started
    carry_tls(edge, node, printed(minted, "token"))
    page.write("node.yaml", node)
    page.start("node-start", node, tmp_path)

    def listed() -> bool:
        return online(json.loads(page.run("pool", edge)), "gpu-1-ollama")

    wait_for(listed, READY_TIMEOUT_S, f"gpu-1 online (Node install took {install_s:.0f} s)")
