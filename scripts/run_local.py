"""`make run`: set up on first use, then start an Edge and a local Node on loopback.

First run: migrate, import configs/edge.yaml into an empty catalog, create an admin
login (password printed once), mint the local Node's token and a client token (their
sha256 go into the catalog; the raw values are kept only under var/, mode 0600, so
later runs can start the Node and print the client token). Later runs just start.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def first_run_setup() -> dict[str, str]:
    manage("iop_config", "import", "--if-empty", str(ROOT / "configs" / "edge.yaml"))
    node = json.loads(manage("iop_token", "--json", "--node", "node-local", capture=True))
    # Every principal token gets a freshly minted secret: the example hashes never stay.
    client = json.loads(
        manage(
            "iop_token",
            "--json",
            "--principal",
            "app-notebook",
            "--principal-ref",
            "team-research",
            capture=True,
        )
    )
    ci = json.loads(
        manage(
            "iop_token",
            "--json",
            "--principal",
            "app-ci",
            "--principal-ref",
            "team-research",
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
    tokens = {"node": node["token"], "client": client["token"], "ci": ci["token"]}
    write_private(TOKENS, json.dumps(tokens))
    return tokens


def main() -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    manage("migrate", "--noinput", "-v", "0")
    tokens = json.loads(TOKENS.read_text()) if TOKENS.exists() else first_run_setup()
    write_private(VAR / "node-token", tokens["node"])
    node_yaml = VAR / "node.yaml"
    node_yaml.write_text(
        "node_id: node-local\n"
        "edge_url: ws://127.0.0.1:7700/ws/node\n"
        f"token: {{file: {VAR / 'node-token'}}}\n"
    )
    edge = subprocess.Popen(
        [PY, str(ROOT / "manage.py"), "runedge"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert edge.stdout is not None
    for line in edge.stdout:
        print(line, end="")
        if line.startswith("IOP Edge ready"):
            break
    else:
        code = edge.wait()
        print(f"The Edge did not start (exit {code}); see the messages above.", file=sys.stderr)
        return 1
    node = subprocess.Popen([PY, "-m", "nodes.agent.main", "--config", str(node_yaml)], cwd=ROOT)
    print(
        "\nClient token (keep it private): " + tokens["client"] + "\n"
        "Try it (the CLI-backed `echo` model works on a bare machine):\n"
        "  curl -s http://127.0.0.1:8080/v1/chat/completions \\\n"
        f"    -H 'Authorization: Bearer {tokens['client']}' \\\n"
        "    -H 'Content-Type: application/json' \\\n"
        '    -d \'{"model": "echo", "messages": [{"role": "user", "content": "hello"}]}\'\n'
        "Admin: http://127.0.0.1:8080/admin/   Pool status: http://127.0.0.1:8080/admin/pool-status/\n"
        "Stop with Ctrl-C."
    )

    def stop(*_: object) -> None:
        node.terminate()
        edge.terminate()

    signal.signal(signal.SIGTERM, stop)
    try:
        for line in edge.stdout:
            print(line, end="")
        edge.wait()
    except KeyboardInterrupt:
        stop()
    node.wait(timeout=15)
    edge.wait(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
