"""`make run`: set up on first use, then start an Edge and a local Node on loopback.

First run: migrate, mint the local Node's token and the client tokens, import
configs/edge.yaml with their sha256 in place of the example hashes into an empty catalog,
create an admin login (password printed once). The raw tokens are kept only under var/,
mode 0600, so later runs can start the Node and print the client token. Later runs just
start. Every run writes var/node.yaml with a policy allowing exactly the catalog's
providers for node-local (``manage.py iop_node_policy``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's modules, whatever the venv was installed from
from catalog.tokens import mint_token  # noqa: E402  (no Django: minted in this process)

VAR = Path(os.environ.get("IOP_VAR_DIR", ROOT / "var"))
PY = sys.executable
TOKENS = VAR / "local-tokens.json"


def manage(*args: str, capture: bool = False) -> str:
    result = subprocess.run(
        [PY, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        check=True,
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    return result.stdout or ""


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


# Who gets a freshly minted token: the local Node and the example's two principal tokens.
NODE_ID = "node-local"
PRINCIPALS = {"client": "app-notebook", "ci": "app-ci"}
PRINCIPAL_REF = "team-research"


def mint() -> dict[str, str]:
    """A new token and its sha256, as ``iop_token`` without a target mints them (it stores
    nothing), in this process: no Django start per token."""
    token, digest = mint_token()
    return {"token": token, "sha256": digest}


def with_minted_hashes(tokens: dict[str, dict[str, str]]) -> Path:
    """configs/edge.yaml with the minted hashes in place of its example ones (which do not
    load outside tests, docs/configuration.md "Token hashes"), written under var/."""
    document = yaml.safe_load((ROOT / "configs" / "edge.yaml").read_text())
    for node in document["nodes"]:
        if node["id"] == NODE_ID:
            node["token_hash_sha256"] = tokens["node"]["sha256"]
    for entry in document["openai"]["principal_tokens"]:
        for name, ref in PRINCIPALS.items():
            if entry["token_ref"] == ref:
                entry["token_hash_sha256"] = tokens[name]["sha256"]
    path = VAR / "edge.first-run.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def first_run_setup() -> dict[str, str]:
    # Every token is freshly minted: the example hashes never load (R-CFG-12).
    minted = {"node": mint(), **{name: mint() for name in PRINCIPALS}}
    imported = manage(
        "iop_config", "import", "--if-empty", str(with_minted_hashes(minted)), capture=True
    )
    print(imported, end="")
    if imported.startswith("catalog not empty"):
        # A catalog from an earlier run whose token file is gone: mint into it instead.
        minted["node"] = json.loads(manage("iop_token", "--json", "--node", NODE_ID, capture=True))
        for name, ref in PRINCIPALS.items():
            minted[name] = json.loads(
                manage(
                    "iop_token",
                    "--json",
                    "--principal",
                    ref,
                    "--principal-ref",
                    PRINCIPAL_REF,
                    capture=True,
                )
            )
    password = secrets.token_urlsafe(12)
    created = subprocess.run(
        [
            PY,
            str(ROOT / "manage.py"),
            "createsuperuser",
            "--noinput",
            "--skip-checks",  # they look at code: `manage.py check` (make test)
            "--username",
            "admin",
            "--email",
            "admin@localhost",
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SUPERUSER_PASSWORD": password},
        capture_output=True,
        text=True,
    )
    if created.returncode == 0:
        print(f"Admin login: admin / {password}  (printed once; change it in the admin)")
    tokens = {name: value["token"] for name, value in minted.items()}
    write_private(TOKENS, json.dumps(tokens))
    return tokens


def main() -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    manage("migrate", "--noinput", "-v", "0", "--skip-checks")  # `manage.py check`: make test
    tokens = json.loads(TOKENS.read_text()) if TOKENS.exists() else first_run_setup()
    write_private(VAR / "node-token", tokens["node"])
    node_yaml = VAR / "node.yaml"
    # R-TLS-3: the local Node runs exactly the catalog's providers for it, nothing else.
    policy = manage("iop_node_policy", "node-local", capture=True)
    node_yaml.write_text(
        "node_id: node-local\n"
        "edge_url: ws://127.0.0.1:7700/ws/node\n"
        f"token: {{file: {VAR / 'node-token'}}}\n" + policy
    )
    edge = subprocess.Popen(
        [PY, str(ROOT / "manage.py"), "runedge"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    running = [edge]
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in running:
            proc.terminate()

    # Before the wait for the ready line: a TERM at any moment stops what has started.
    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C, even when started with SIGINT ignored (a background job of a script is)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if not wait_ready(edge):
            code = edge.wait()
            if stopping:
                return 0
            print(f"The Edge did not start (exit {code}); see the messages above.", file=sys.stderr)
            return 1
        node = subprocess.Popen(node_argv(node_yaml), cwd=ROOT)
        running.append(node)
        if stopping:  # a TERM while the Node was starting
            node.terminate()
        print(usage(tokens["client"]), flush=True)
        assert edge.stdout is not None
        for line in edge.stdout:
            print(line, end="")
        edge.wait()
    except KeyboardInterrupt:
        stop()
    for proc in running:
        proc.wait(timeout=15)
    return 0


READY = "IOP Edge ready"


def node_argv(node_yaml: Path) -> list[str]:
    """The local Node's command: ``LOG_LEVEL`` (the Edge's variable) becomes its
    ``--log-level``, so ``LOG_LEVEL=DEBUG make run`` shows both sides' decisions;
    ``LOG_FORMAT`` and ``OTEL_*`` it reads from the environment itself."""
    argv = [PY, "-m", "nodes.agent.main", "--config", str(node_yaml)]
    level = os.environ.get("LOG_LEVEL", "").strip()
    return [*argv, "--log-level", level] if level else argv


def is_ready_line(line: str) -> bool:
    """The Edge's ready line, as plain text or (``LOG_FORMAT=json``) as a JSON line's message."""
    if line.startswith(READY):
        return True
    if not line.startswith("{"):
        return False
    try:
        message = json.loads(line).get("message")
    except (ValueError, AttributeError):
        return False
    return isinstance(message, str) and message.startswith(READY)


def wait_ready(edge: subprocess.Popen[str]) -> bool:
    """Echo the Edge's output until its ready line; False if it ended first."""
    assert edge.stdout is not None
    for line in edge.stdout:
        print(line, end="", flush=True)
        if is_ready_line(line):
            return True
    return False


def usage(client_token: str) -> str:
    """What ``make run`` prints once both are up (plain text in either ``LOG_FORMAT``: it is
    for the person at the terminal)."""
    return (
        "\nClient token (keep it private): " + client_token + "\n"
        "Try it (the CLI-backed `echo` model works on a bare machine):\n"
        "  curl -s http://127.0.0.1:8080/v1/chat/completions \\\n"
        f"    -H 'Authorization: Bearer {client_token}' \\\n"
        "    -H 'Content-Type: application/json' \\\n"
        '    -d \'{"model": "echo", "messages": [{"role": "user", "content": "hello"}]}\'\n'
        "Admin: http://127.0.0.1:8080/admin/   Pool status: http://127.0.0.1:8080/admin/pool-status/\n"
        "Stop with Ctrl-C."
    )


if __name__ == "__main__":
    sys.exit(main())
