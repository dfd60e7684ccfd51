"""``tests.support.free_port``: a port for each listener a test starts, never one another
listener of this process or of a parallel test process was given."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.support import Stack, free_port, ports
from tests.support.processes import ROOT, child_env

CHILD = """
import json, sys
from tests.support import ports
with ports._lock:
    print(json.dumps([ports.claim(int(p)) for p in sys.argv[1:]]))
"""


def unclaimed_port() -> int:
    """A candidate port that this process has not handed out and that is bindable now."""
    low, high = ports.ephemeral_range()
    for port in ports.candidates():
        if port not in ports._handed_out and ports.bindable(port):
            assert not low <= port <= high
            return port
    raise AssertionError("no candidate port")


def test_a_process_never_gets_a_port_twice_each_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    given = [free_port() for _ in range(300)]
    assert len(set(given)) == len(given)
    assert not [p for p in given if low <= p <= high]
    assert all(ports.bindable(p) for p in given)


def test_threads_asking_at_once_get_different_ports() -> None:
    given: list[int] = []

    def ask() -> None:
        got = [free_port() for _ in range(25)]
        given.extend(got)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(given) == 200
    assert len(set(given)) == 200


def test_a_port_another_test_process_holds_is_not_handed_out_there() -> None:
    """The other process has not handed the port out itself and could bind it: only the
    shared lock keeps it away."""
    held = free_port()
    control = unclaimed_port()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(held), str(control)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == [False, True]


def test_a_port_with_a_listener_on_it_is_not_handed_out() -> None:
    port = unclaimed_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with ports._lock:
            assert not ports.claim(port)
    assert port not in ports._handed_out


def test_the_listeners_of_many_stacks_never_share_a_port(tmp_path: Path) -> None:
    stacks = [Stack(tmp_path / str(i)) for i in range(30)]
    given = [port for stack in stacks for port in stack.ports.values()]
    assert len(set(given)) == len(given) == 90
