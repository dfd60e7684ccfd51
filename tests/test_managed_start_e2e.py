"""A managed Edge refuses to start when a managed key file does not load, naming the file
and never a key (R-AUTH-4, R-MGD-4): ``runedge`` as a real process."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from catalog.keyring import new_keyring
from secretref.keyfiles import create_private
from tests.support.managed import managed_document, mint_keys
from tests.support.processes import ROOT, Proc, child_env, free_port, migrated_template
from tests.support.tls import self_signed

pytestmark = pytest.mark.slow


def configure(
    directory: Path, document: dict, tls_key_mode: int = 0o600
) -> tuple[Path, dict[str, str]]:
    """``edge.yaml`` with TLS and free ports, on its own database: (config, environment)."""
    cert, _ = self_signed(directory)
    (directory / "key.pem").chmod(tls_key_mode)
    tls = {"cert_file": str(cert), "key_file": str(directory / "key.pem")}
    document["edge"]["tls"] = document["openai"]["tls"] = tls
    for section in ("edge", "admin", "openai"):
        document[section]["listen"] = f"127.0.0.1:{free_port()}"
    document["edge"]["bootstrap_dir"] = str(directory / "bootstrap")
    config = directory / "edge.yaml"
    config.write_text(yaml.safe_dump(document))
    database = directory / "edge.sqlite3"
    if not database.exists():
        shutil.copyfile(migrated_template(), database)
    env = child_env({"DATABASE_URL": f"sqlite:///{database}", "IOP_VAR_DIR": str(directory)})
    return config, env


def runedge(
    directory: Path, document: dict, tls_key_mode: int = 0o600
) -> subprocess.CompletedProcess[str]:
    """``runedge --config`` on its own database, expected to exit at start."""
    config, env = configure(directory, document, tls_key_mode)
    return subprocess.run(
        [sys.executable, "manage.py", "runedge", "--config", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "broken, message",
    [
        ("issuer", "credential_plane.issuer.private_key_file: {path} is not a PEM private key"),
        ("recipient", "nodes[n1].credential_recipient.public_key_file: {path} is not a PEM"),
        ("keyring", "credential_plane.keyring_file: the keyring file {path} is not a JSON"),
    ],
)
def test_runedge_refuses_a_managed_key_file_that_does_not_load_r_auth_4(
    tmp_path: Path, broken: str, message: str
):
    """R-AUTH-4, R-MGD-4: the issuer key, a Node's recipient key and the keyring are read
    at start; the first that fails stops the Edge with its path."""
    keys = mint_keys(tmp_path / "keys", "n1")
    keyring = tmp_path / "keyring.json"
    create_private(keyring, new_keyring("k1").dump().encode())
    path = {"issuer": keys.issuer_key, "recipient": keys.node_pub, "keyring": keyring}[broken]
    key_text = path.read_text()
    path.write_text("-----BEGIN NONSENSE-----\n")
    done = runedge(tmp_path, managed_document(keys, keyring))
    assert done.returncode != 0
    assert message.format(path=path) in done.stderr
    assert "IOP Edge ready" not in done.stdout
    assert key_text not in done.stderr + done.stdout


def test_a_refused_start_never_becomes_the_active_revision_r_cfg_14(tmp_path: Path):
    """R-CFG-14: an Edge started once on a valid managed config (revision 1 active); then
    a changed config whose keyring does not load: the start is refused, no log line says
    a revision "is now active" for it, and ``export --revision active`` still prints the
    first document."""
    keys = mint_keys(tmp_path / "keys", "n1")
    keyring = tmp_path / "keyring.json"
    create_private(keyring, new_keyring("k1").dump().encode())
    first = managed_document(keys, keyring)
    config, env = configure(tmp_path, first)
    edge = Proc(
        "edge",
        [sys.executable, "manage.py", "runedge", "--config", str(config)],
        env,
        tmp_path / "edge.log",
    )
    edge.start()
    try:
        deadline = time.monotonic() + 60
        while "IOP Edge ready" not in edge.log.read_text(errors="replace"):
            assert edge.alive() and time.monotonic() < deadline, edge.log.read_text()
            time.sleep(0.05)
    finally:
        edge.stop()
    assert "revision 1 is now active" in edge.log.read_text()
    second = yaml.safe_load(config.read_text())
    second["provider_pool"]["max_queue"] = 7
    keyring.write_text("-----BEGIN NONSENSE-----\n")
    done = runedge(tmp_path, second)
    assert done.returncode != 0
    assert "managed mode cannot start: credential_plane.keyring_file" in done.stderr
    assert "is now active" not in done.stderr + done.stdout
    export = subprocess.run(
        [sys.executable, "manage.py", "iop_config", "export", "--revision", "active"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert yaml.safe_load(export.stdout)["provider_pool"]["max_queue"] == 4


@pytest.mark.parametrize("which", ["issuer", "keyring", "tls"])
def test_runedge_refuses_a_private_key_file_others_can_read_r_tls_5(tmp_path: Path, which: str):
    """R-TLS-5: the issuer key, the keyring or a listener's TLS key readable by group or
    others stops the Edge with one line naming the file and the fix; exit 1, no traceback,
    no key."""
    keys = mint_keys(tmp_path / "keys", "n1")
    keyring = tmp_path / "keyring.json"
    create_private(keyring, new_keyring("k1").dump().encode())
    path = {"issuer": keys.issuer_key, "keyring": keyring, "tls": tmp_path / "key.pem"}[which]
    if which != "tls":
        path.chmod(0o644)
    done = runedge(tmp_path, managed_document(keys, keyring), 0o644 if which == "tls" else 0o600)
    assert done.returncode == 1
    assert f"{path} can be read by others (mode 644); run chmod 600 {path}" in done.stderr
    assert "Traceback" not in done.stderr
    assert path.read_text() not in done.stderr + done.stdout
    assert "IOP Edge ready" not in done.stdout
