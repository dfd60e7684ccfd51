"""The keyring file survives a crash of ``iop_keyring rotate`` at any point (R-MGD-8):
``manage.py`` killed with SIGKILL half-way through writing the new file, or between the
write and the rename, leaves a keyring that opens every slot sealed before; key ids of the
default form never collide; ``--help`` says which entry is the newest."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from catalog.keyring import Keyring, new_keyring
from secretref.keyfiles import PrivateFileError, create_private
from tests.support.processes import ROOT, child_env, migrated_template

# Run inside ``manage.py shell``: make the process die (SIGKILL: no cleanup, like a power
# cut) at the chosen point of the keyring write, then rotate.
CRASH = """
import os, signal
real_fdopen = os.fdopen

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

class HalfWritten:
    def __init__(self, handle):
        self.handle = handle
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.handle.close()
    def write(self, text):
        self.handle.write(text[: len(text) // 2])
        self.handle.flush()
        os.fsync(self.handle.fileno())
        die()
    def __getattr__(self, name):
        return getattr(self.handle, name)

if os.environ["CRASH_AT"] == "write":
    os.fdopen = lambda fd, *a, **k: HalfWritten(real_fdopen(fd, *a, **k))
else:
    os.replace = die
from django.core.management import call_command
call_command("iop_keyring", "rotate", "--keyring", os.environ["KEYRING"], "--key-id", "k2")
"""


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
@pytest.mark.parametrize("crash_at", ["write", "replace"])
def test_a_rotation_killed_mid_write_or_before_the_rename_leaves_a_keyring_that_opens_every_slot(
    tmp_path: Path, crash_at: str
) -> None:
    """R-MGD-8: SIGKILL half-way through writing the new keyring, or between the write and
    the rename: the file still loads and opens every sealed value it opened before; the
    next rotation succeeds."""
    keyring = tmp_path / "keyring.json"
    ring = new_keyring("k1")
    create_private(keyring, ring.dump().encode())
    sealed = {slot: ring.seal(f"sk-{slot}".encode(), slot) for slot in ("a", "b", "c")}
    database = tmp_path / "edge.sqlite3"
    shutil.copyfile(migrated_template(), database)
    env = child_env(
        {
            "DATABASE_URL": f"sqlite:///{database}",
            "IOP_VAR_DIR": str(tmp_path / "var"),
            "KEYRING": str(keyring),
            "CRASH_AT": crash_at,
        }
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", CRASH],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    survived = Keyring.load(keyring)
    assert survived.key_ids == ("k1",)
    for slot, value in sealed.items():
        assert survived.open(value, slot) == f"sk-{slot}".encode()
    env["CRASH_AT"] = "none"
    subprocess.run(
        [sys.executable, "manage.py", "iop_keyring", "rotate", "--keyring", str(keyring)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    rotated = Keyring.load(keyring)
    assert rotated.key_ids[0] == "k1" and len(rotated.key_ids) == 2
    assert all(rotated.open(value, slot) for slot, value in sealed.items())
    assert oct(os.stat(keyring).st_mode & 0o777) == "0o600"


@pytest.mark.django_db
def test_default_key_ids_never_collide_even_within_one_second(tmp_path: Path) -> None:
    """R-MGD-8: three rotations in a row without --key-id each add a key of their own."""
    keyring = tmp_path / "keyring.json"
    call_command("iop_keyring", "init", str(keyring), stdout=io.StringIO())
    for _ in range(3):
        call_command("iop_keyring", "rotate", "--keyring", str(keyring), stdout=io.StringIO())
    ids = list(json.loads(keyring.read_text()))
    assert len(ids) == 4 and len(set(ids)) == 4


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_a_key_file_is_never_written_over_a_file_or_through_a_symlink(tmp_path: Path) -> None:
    """R-MGD-8, R-TLS-5: an existing file or a symlink at a key file's path is left alone,
    and nothing is left beside it."""
    target = tmp_path / "elsewhere.json"
    target.write_text("untouched")
    link = tmp_path / "keyring.json"
    link.symlink_to(target)
    with pytest.raises(PrivateFileError, match="exists; a key file is never overwritten"):
        create_private(link, new_keyring("k1").dump().encode())
    assert target.read_text() == "untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "keyring.json"]


def help_text(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", "iop_keyring", *args, "--help"],
        cwd=ROOT,
        env=child_env({"DATABASE_URL": "sqlite:///:memory:"}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return " ".join(done.stdout.split())


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_the_help_says_the_last_entry_is_the_newest_and_documents_the_options() -> None:
    """R-MGD-8: ``iop_keyring --help`` names the newest key; ``rotate --help`` documents
    ``--keyring`` and ``--key-id``."""
    assert "the LAST entry is the newest key" in help_text()
    rotate = help_text("rotate")
    assert "--keyring FILE" in rotate and "--key-id" in rotate
    assert "last (newest) entry" in rotate
