"""``SECRET_KEY`` without the variable or its file: a value generated once into
``var/secret_key`` (iop_site.env.env_secret), the same for processes that start at once
(an Edge and a command, parallel test workers on a fresh checkout)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from iop_site.env import env_secret

NAME = "IOP_TEST_UNSET_SECRET"


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.delenv(f"{NAME}_FILE", raising=False)


def test_a_process_that_loses_the_race_uses_the_value_the_other_wrote(tmp_path, monkeypatch):
    """Two starts both find no file; the one that writes second keeps the first one's value
    (it neither fails nor replaces it), and no draft is left behind."""
    target = tmp_path / "var" / "secret_key"
    target.parent.mkdir()
    real_exists = Path.exists

    def other_process_writes_meanwhile(path: Path) -> bool:
        if path == target and not real_exists(path):
            target.write_text("the-other-process-value")
            target.chmod(0o600)
            return False  # as this process saw it a moment ago
        return real_exists(path)

    monkeypatch.setattr(Path, "exists", other_process_writes_meanwhile)
    assert env_secret(NAME, target) == "the-other-process-value"
    assert [p.name for p in target.parent.iterdir()] == ["secret_key"]


def test_the_first_start_writes_a_private_value_that_later_starts_read(tmp_path, monkeypatch):
    target = tmp_path / "secret_key"
    first = env_secret(NAME, target)
    assert len(first) >= 50 and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert env_secret(NAME, target) == first
    monkeypatch.setenv(NAME, "given")
    assert env_secret(NAME, target) == "given"
