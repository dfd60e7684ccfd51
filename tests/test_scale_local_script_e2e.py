"""The documented ``scripts/scale_local.py --edges 3 --nodes 2`` (docs/scale-out.md, "On one
machine"), run as written: three Edges and two Nodes on the local PostgreSQL and Redis, each
Edge answers the printed token, and Ctrl-C leaves no database and no Redis key behind."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import openai
import pytest

from tests.support.cluster import scale_out_redis_url
from tests.support.processes import sigint_ignored

ROOT = Path(__file__).resolve().parent.parent
DATABASE = os.environ.get("IOP_TEST_DATABASE_URL", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not DATABASE.startswith("postgres") or scale_out_redis_url() is None,
        reason="needs PostgreSQL and Redis: IOP_TEST_DATABASE_URL and IOP_TEST_REDIS_URL",
    ),
]
START_S = 90.0


def documented_command() -> list[str]:
    text = (ROOT / "docs" / "scale-out.md").read_text()
    (line,) = re.findall(r"^\.venv/bin/python scripts/scale_local\.py .*$", text, re.M)
    argv = shlex.split(line)
    return [sys.executable, *argv[1:]]  # this checkout's interpreter


def test_scale_local_starts_three_edges_that_answer_and_stops_clean_r_scale_2() -> None:
    import psycopg
    import redis

    parts = urlsplit(DATABASE)
    server = urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
    env = {**os.environ, "IOP_SCALE_POSTGRES": server, "IOP_REDIS_URL": scale_out_redis_url()}
    with sigint_ignored():  # Ctrl-C still stops it, since it says so
        proc = subprocess.Popen(
            documented_command(),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + START_S
        while not lines or lines[-1].strip() != "Ctrl-C stops everything":
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        output = "".join(lines)
        apis = re.findall(r"api (http://\S+/v1)", output)
        (token,) = re.findall(r"^client token: (\S+)$", output, re.M)
        (database,) = re.findall(r"database (\S+)$", output, re.M)
        (prefix,) = re.findall(r"Redis prefix (\S+)\)", output)
        assert len(apis) == 3, output
        for api in apis:
            with openai.OpenAI(base_url=api, api_key=token, max_retries=0, timeout=30) as client:
                answer = until_served(client)
            assert answer.choices[0].message.content, output
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # stop it anyway (its TERM stops its Edges too)
            proc.terminate()
            proc.communicate(timeout=60)
            raise
    assert proc.returncode == 0, output + rest
    assert "stopped; database dropped" in rest
    with psycopg.connect(urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))) as db:
        found = db.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchall()
    assert found == []
    keys = redis.Redis.from_url(scale_out_redis_url()).keys(f"{prefix}:*")
    assert keys == []


def until_served(client: openai.OpenAI) -> openai.types.chat.ChatCompletion:
    """A fresh key prefix refuses admissions for one lease TTL (``pool_recovering``,
    docs/scale-out.md): ask again until it is over."""
    deadline = time.monotonic() + START_S
    while True:
        try:
            return client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hi"}]
            )
        except openai.APIStatusError as exc:
            code = (exc.body or {}).get("code") if isinstance(exc.body, dict) else None
            if code != "pool_recovering" or time.monotonic() > deadline:
                raise
        time.sleep(0.2)
