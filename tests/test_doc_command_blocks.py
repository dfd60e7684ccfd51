"""Every command block of the README and of docs/ is run as written by a test, or says why it
is not (docs/testing.md, "Commands in the docs"): a ```` ```sh TAG=NAME ```` block is read by
the test module that runs that page's ``TAG`` blocks (``RUNNERS``), which names ``NAME``; a
```` ```sh not-run=REASON ```` block gives one of the reasons below."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```(?:sh|bash|shell|console)\b[ \t]*(\S*)[ \t]*$", re.MULTILINE)
TAGGED = re.compile(r"([\w-]+)=([\w.-]+)")

# (page, tag) -> the test modules that read that page's blocks of that tag and run them
RUNNERS = {
    ("README.md", "readme"): ["tests/test_readme_e2e.py", "tests/test_observability_doc_e2e.py"],
    ("architecture.md", "doc"): ["tests/test_import_table.py"],
    ("credentials.md", "credentials"): ["tests/test_docs_pages_e2e.py"],
    ("journeys.md", "journey"): ["tests/test_journeys_e2e.py"],
    ("journeys.md", "agents"): ["tests/test_coding_agents_e2e.py"],
    ("node.md", "node-tls"): ["tests/test_docs_pages_e2e.py"],
    ("observability.md", "observability"): ["tests/test_observability_doc_e2e.py"],
    ("refresh.md", "refresh"): ["tests/test_journeys_e2e.py"],
    ("scale-out.md", "journey"): ["tests/test_scale_out_doc_e2e.py"],
}
# Why a block is not run, each a reason no test can remove
NOT_RUN = {
    "runs-the-suite": "it runs the test suite itself (or part of it)",
    "interactive": "it asks its questions on a terminal",
    "benchmark": "it measures the machine for minutes; its results are not pass or fail",
    "needs-docker": "it starts a third-party container (the test suite runs no Docker)",
    "placeholders": "its values are placeholders; the walkthrough it points to runs the commands",
}


def blocks() -> list[tuple[str, int, str]]:
    """(page, line, info string) of every shell fence of every page."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((page.name, line, match.group(1)))
    return found


def test_pages_have_shell_blocks_to_check() -> None:
    assert len(blocks()) > 40


@pytest.mark.parametrize(("page", "line", "info"), blocks(), ids=lambda v: str(v))
def test_every_shell_block_is_run_by_a_test_or_says_why_not(page: str, line: int, info: str):
    tagged = TAGGED.fullmatch(info)
    assert tagged, f"{page}:{line}: an untagged shell block (TAG=NAME or not-run=REASON)"
    tag, name = tagged.groups()
    if tag == "not-run":
        assert name in NOT_RUN, f"{page}:{line}: not-run={name}; the reasons: {sorted(NOT_RUN)}"
        return
    assert (page, tag) in RUNNERS, f"{page}:{line}: no test runs the {tag}= blocks of {page}"
    sources = [(ROOT / module).read_text() for module in RUNNERS[page, tag]]
    assert any(re.search(rf"[\"']{re.escape(name)}[\"']", source) for source in sources), (
        f"{page}:{line}: no runner of {tag}= blocks names {name!r}"
    )


def test_every_reason_not_to_run_is_in_the_testing_doc() -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    for reason in NOT_RUN:
        assert f"`not-run={reason}`" in text, reason


def test_every_runner_exists() -> None:
    for modules in RUNNERS.values():
        for module in modules:
            assert Path(ROOT / module).is_file(), module
