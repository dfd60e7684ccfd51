"""A copy of the checkout that runs the documented ``make`` on the project's own ``.venv``
(tests.support.journeys.link_project_venv) never installs into that ``.venv`` again."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.journeys import link_project_venv, source_checkout


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_make_in_a_copy_on_the_project_venv_finds_its_install_up_to_date(tmp_path: Path) -> None:
    copy = source_checkout(tmp_path / "copy")
    later = time.time() + 60  # as after an edit of pyproject.toml: newer than the install
    os.utime(copy / "pyproject.toml", (later, later))
    link_project_venv(copy)
    question = subprocess.run(
        ["make", "-q", ".venv/.installed-base"], cwd=copy, capture_output=True, timeout=30
    )
    assert question.returncode == 0  # `make run` there would not run pip into the shared .venv
