"""The order `make test` hands modules out in (tests/support/schedule.py): longest first, the
modules that mostly wait spread among those that work, unmeasured ones last."""

from __future__ import annotations

from pathlib import Path

from tests.support.schedule import order, read_times, write_times

TIMES = {  # module: (wall s, CPU s)
    "work_a.py": (100.0, 80.0),
    "work_b.py": (90.0, 70.0),
    "work_c.py": (80.0, 60.0),
    "work_d.py": (70.0, 50.0),
    "wait_a.py": (60.0, 6.0),
    "wait_b.py": (50.0, 5.0),
}


def test_the_longest_working_module_goes_first_and_waiting_ones_never_side_by_side():
    handed = order(["new_b.py", *sorted(TIMES), "new_a.py"], TIMES)
    assert handed[0] == "work_a.py"
    assert handed[-2:] == ["new_b.py", "new_a.py"]  # unmeasured: last, in collection order
    working = [m for m in handed if m.startswith("work")]
    waiting = [m for m in handed if m.startswith("wait")]
    assert working == ["work_a.py", "work_b.py", "work_c.py", "work_d.py"]
    assert waiting == ["wait_a.py", "wait_b.py"]
    places = [handed.index(m) for m in waiting]
    assert places[1] - places[0] > 1  # a working module between them
    assert places[0] < handed.index("work_c.py")  # the first waits early, not at the end


def test_times_are_stored_rounded_one_module_a_line(tmp_path: Path):
    path = tmp_path / "module_times.json"
    count = write_times({"b.py": (2.4, 1.6), "a.py": (0.4, 0.3), "c.py": (12.6, 0.2)}, path)
    assert count == 2  # under half a second: left out
    assert path.read_text().splitlines() == ["{", '"b.py": [2, 2],', '"c.py": [13, 0]', "}"]
    assert read_times(path) == {"b.py": (2.0, 2.0), "c.py": (13.0, 0.0)}
    assert read_times(tmp_path / "missing.json") == {}
