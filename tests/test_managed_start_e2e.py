"""A managed Edge refuses to start when a managed key file does not load, naming the file
and never a key (R-AUTH-4, R-MGD-4): ``runedge`` as a real process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from catalog.keyring import new_keyring, write_private
from tests.support.managed import managed_document, mint_keys
from tests.support.processes import ROOT, child_env, free_port, migrated_template
from tests.support.tls import self_signed

pytestmark = pytest.mark.slow


def runedge(
    directory: Path, document: dict, tls_key_mode: int = 0o600
) -> subprocess.CompletedProcess[str]:
    """``runedge --config`` on its own database, expected to exit at start."""
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
    shutil.copyfile(migrated_template(), database)
    env = child_env({"DATABASE_URL": f"sqlite:///{database}", "IOP_VAR_DIR": str(directory)})
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
    write_private(keyring, new_keyring("k1").dump())
    path = {"issuer": keys.issuer_key, "recipient": keys.node_pub, "keyring": keyring}[broken]
    key_text = path.read_text()
    path.write_text("-----BEGIN NONSENSE-----\n")
    done = runedge(tmp_path, managed_document(keys, keyring))
    assert done.returncode != 0
    assert message.format(path=path) in done.stderr
    assert "IOP Edge ready" not in done.stdout
    assert key_text not in done.stderr + done.stdout


@pytest.mark.parametrize("which", ["issuer", "keyring", "tls"])
def test_runedge_refuses_a_private_key_file_others_can_read_r_tls_5(tmp_path: Path, which: str):
    """R-TLS-5: the issuer key, the keyring or a listener's TLS key readable by group or
    others stops the Edge with one line naming the file and the fix; exit 1, no traceback,
    no key."""
    keys = mint_keys(tmp_path / "keys", "n1")
    keyring = tmp_path / "keyring.json"
    write_private(keyring, new_keyring("k1").dump())
    path = {"issuer": keys.issuer_key, "keyring": keyring, "tls": tmp_path / "key.pem"}[which]
    if which != "tls":
        path.chmod(0o644)
    done = runedge(tmp_path, managed_document(keys, keyring), 0o644 if which == "tls" else 0o600)
    assert done.returncode == 1
    assert f"{path} can be read by others (mode 644); run chmod 600 {path}" in done.stderr
    assert "Traceback" not in done.stderr
    assert path.read_text() not in done.stderr + done.stdout
    assert "IOP Edge ready" not in done.stdout
