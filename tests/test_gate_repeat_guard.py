"""The repeat_guard detector on a corpus of loops and normal text.

R-SEG-3, R-SEG-5, R-SEG-7, R-SEG-8.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pool.gate import FilterPipeline, FilterSpec, RepeatGuard, find_repeat
from tests.support.examples import examples

NORMAL = sorted((Path(__file__).parent / "data" / "gate" / "normal").glob("*.txt"))
HOLDS = (100, 250, 500, 1000)


def chunked(text: str, seed: int, largest: int = 12) -> list[str]:
    """``text`` cut at random points, as a model's stream would deliver it."""
    rng = random.Random(seed)
    parts, i = [], 0
    while i < len(text):
        step = rng.randint(1, largest)
        parts.append(text[i : i + step])
        i += step
    return parts


def run(guard: RepeatGuard, parts: list[str]) -> str:
    released = "".join(guard.feed(p) for p in parts)
    return released + guard.finish()


@pytest.mark.parametrize("path", NORMAL, ids=lambda p: p.stem)
@pytest.mark.parametrize("hold", HOLDS)
def test_normal_text_never_fires_and_is_released_whole(path: Path, hold: int) -> None:
    """R-SEG-7: code, tables, lists, refrains and varying log lines pass unchanged."""
    text = path.read_text(encoding="utf-8")
    for seed in range(5):
        guard = RepeatGuard(hold)
        assert run(guard, chunked(text, seed)) == text
        assert guard.evidence is None, f"fired on {path.name}: {guard.evidence}"


def test_the_corpus_holds_every_kind_of_normal_text_the_rule_names() -> None:
    """R-SEG-7 names code, tables, lists, poems with refrains and repeated-but-varying lines."""
    assert {p.stem for p in NORMAL} >= {
        "code_python",
        "code_c_switch",
        "markdown_table",
        "numbered_list",
        "poem_refrain",
        "log_lines",
    }


LOOPS = {
    "one character": "a",
    "a word": "hello ",
    "a long sentence": "I will now check the configuration file again to be sure. ",
    "emoji with joiners": "👩‍👩‍👧‍👦 🎉 ",
    "korean": "다시 확인하겠습니다. ",
    "a line of code": "    result = compute(result)\n",
}


LOOP_CASES = [
    pytest.param(unit, hold, id=f"{name}-{hold}")
    for name, unit in LOOPS.items()
    for hold in (100, 500)
    if len(unit) <= hold // 4  # longer units are outside the rule (see the test below)
]


@pytest.mark.parametrize(("unit", "hold"), LOOP_CASES)
def test_a_loop_fires_and_is_never_released(unit: str, hold: int) -> None:
    """R-SEG-5: back-to-back copies covering half the window fire; the loop stays held."""
    prefix = "Let me think about this step by step before I answer the question. "
    text = prefix + unit * (4 * hold // len(unit) + 4)
    for seed in range(5):
        guard = RepeatGuard(hold)
        released = "".join(guard.feed(p) for p in chunked(text, seed))
        assert guard.evidence is not None
        assert guard.finish() == ""
        assert len(released) <= len(prefix) + len(unit)  # at most the loop's first copy
        assert text.startswith(released)


def test_a_loop_after_a_long_normal_prefix_releases_the_prefix_only() -> None:
    """R-SEG-5: text outside the look-behind window is released; the loop is not."""
    prefix = Path(NORMAL[0]).read_text(encoding="utf-8")
    unit = "The answer is 42. "
    guard = RepeatGuard(200)
    released = run(guard, chunked(prefix + unit * 40, seed=3))
    assert guard.evidence is not None
    assert prefix.startswith(released)
    assert len(prefix) - len(released) <= 200


def test_a_loop_inside_one_large_chunk_is_caught() -> None:
    """R-SEG-5: one delivery carrying the whole loop and more text is checked as it goes."""
    guard = RepeatGuard(100)
    released = guard.feed("intro. " + "ab" * 200 + " and then normal text follows for a while.")
    assert guard.evidence is not None
    assert "abababab" not in released


def test_a_loop_that_ends_mid_unit_is_found_through_its_rotation() -> None:
    """R-SEG-5: the unit is the loop's period, whichever rune the window ends on."""
    window = "xyz" + "abc" * 30 + "ab"
    found = find_repeat(window, 100)
    assert found is not None
    assert found.unit == "cab"  # the rotation the window ends on


def test_repeats_covering_less_than_half_the_window_do_not_fire() -> None:
    """R-SEG-5: the copies must cover at least ceil(H / 2) runes."""
    assert find_repeat("x" * 49, 100) is None
    assert find_repeat("q" + "x" * 50, 100) is not None


def test_a_sentence_loop_longer_than_a_quarter_of_a_small_window_needs_a_larger_window() -> None:
    """R-SEG-5: the operator sizes ``hold_evidence_runes`` to the loops it must catch."""
    unit = LOOPS["a long sentence"]
    assert RepeatGuard(100).feed(unit * 20) and find_repeat((unit * 20)[-100:], 100) is None
    assert find_repeat((unit * 20)[-500:], 500) is not None


def test_units_longer_than_a_quarter_of_the_window_do_not_fire() -> None:
    """R-SEG-5: a unit is 1..H/4 runes; a longer refrain repeated twice is not a loop."""
    unit = "".join(chr(0x41 + i % 26) for i in range(26))  # 26 runes, > 100 // 4
    assert find_repeat(unit * 3, 100) is None
    assert find_repeat(unit * 3, 104) is not None  # 26 <= 104 // 4: now it is


def test_runes_are_code_points_not_bytes() -> None:
    """R-SEG-3: the window counts Unicode code points; multi-byte text is not over-counted."""
    guard = RepeatGuard(10)
    assert guard.feed("가나다라마바사아자차") == ""  # 10 runes, 30 bytes: all held
    assert guard.feed("카") == "가"


def test_observe_mode_releases_everything_and_still_detects() -> None:
    """R-SEG-8: observe detects and reports but never holds or drops text."""
    text = "intro " + "loop " * 100
    guard = RepeatGuard(100, observe=True)
    assert run(guard, chunked(text, seed=1)) == text
    assert guard.evidence is not None and guard.evidence.unit in "loop " * 2


def test_the_pipeline_reports_the_filter_that_fired() -> None:
    """R-SEG-5: the pipeline stops at an enforcing filter and names it."""
    pipeline = FilterPipeline([FilterSpec("repeat_guard", 40)])
    verdicts = [pipeline.feed(p) for p in chunked("fine. " + "no " * 40, seed=2)]
    fired = [v for v in verdicts if v.fired]
    assert fired and fired[0].fired == "repeat_guard"
    assert pipeline.finish().release == ""


def test_the_pipeline_reports_an_observed_repeat_once_and_releases_all() -> None:
    """R-SEG-8: an observing filter reports once per request and changes nothing."""
    pipeline = FilterPipeline([FilterSpec("repeat_guard", 40, observe=True)])
    text = "fine. " + "no " * 40
    verdicts = [pipeline.feed(p) for p in chunked(text, seed=2)]
    assert sum(1 for v in verdicts if v.observed) == 1
    assert "".join(v.release for v in verdicts) + pipeline.finish().release == text


def test_an_unknown_filter_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown stream filter"):
        FilterPipeline([FilterSpec("regex_guard", 40)])


def reference_repeat(window: str, hold: int) -> tuple[str, int] | None:
    """The rule of docs/stream-evidence-gate.md, spelled out by brute force."""
    need = -(-hold // 2)
    for size in range(1, hold // 4 + 1):
        copies = max(2, -(-need // size))
        if size * copies <= len(window) and window[-size * copies :] == window[-size:] * copies:
            return window[-size:], copies
    return None


@settings(max_examples=examples(400), deadline=None)
@given(window=st.text(alphabet="ab ", max_size=160), hold=st.integers(min_value=1, max_value=120))
def test_find_repeat_matches_the_rule_spelled_out(window: str, hold: int) -> None:
    """R-SEG-5: the fast search finds exactly what the brute-force rule finds."""
    found = find_repeat(window, hold)
    got = (found.unit, found.copies) if found else None
    assert got == reference_repeat(window, hold)


@settings(max_examples=examples(1500), deadline=None)
@given(
    prefix=st.text(alphabet="ab", max_size=12),
    unit=st.text(alphabet="ab", min_size=1, max_size=20),
    copies=st.integers(min_value=1, max_value=6),
    hold=st.integers(min_value=8, max_value=80),
)
def test_find_repeat_matches_the_rule_on_near_loops(
    prefix: str, unit: str, copies: int, hold: int
) -> None:
    """R-SEG-5: windows that end in (almost) enough copies of a unit, where the fast search
    has the most candidates to rule out, agree with the rule too."""
    window = prefix + unit * copies
    found = find_repeat(window, hold)
    got = (found.unit, found.copies) if found else None
    assert got == reference_repeat(window, hold)


@pytest.mark.parametrize(
    ("window", "hold"),
    [
        ("baabaabaaaaabaabaaaaabaabaaaa", 54),
        ("aabaabaaaabaabaabaabaaaabaabaabaabaaaabaab", 76),
        ("bbbabbbbbbbbabbbbbbbbabbbbbbbbabbbbb", 67),
    ],
)
def test_a_unit_is_found_past_a_shorter_candidate_too_long_for_the_window(
    window: str, hold: int
) -> None:
    """R-SEG-5: a shorter candidate whose copies would overrun a short window (early in a
    stream) does not hide a longer unit that fits: the rule fires as written."""
    found = find_repeat(window, hold)
    assert found is not None
    assert (found.unit, found.copies) == reference_repeat(window, hold)
