"""`make bench` reports medians and spread of repeated runs, and judges targets on medians
(docs/performance.md). Figures here are made up; nothing is timed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench import _lag_between
from bench_client import WrkResult
from bench_report import Figures, Row, core_checks, render


def row(target: str, mode: str, c: int, rps: float, p50: float, p99: float, **kw) -> Row:
    wrk = WrkResult(requests=int(rps * 3), seconds=3.0, p50_ms=p50, p99_ms=p99, errors=0)
    return Row(target, mode, c, wrk, **kw)


def runs(target: str, mode: str, c: int, figures: list[tuple[float, float, float]], **kw):
    return {(target, mode, c): [row(target, mode, c, *f, **kw) for f in figures]}


def test_a_cell_reports_the_median_and_the_range_of_its_runs() -> None:
    f = Figures(runs("edge", "json", 16, [(900, 5, 20), (1000, 4, 90), (400, 9, 30)]))
    assert f.median(("edge", "json", 16), "rps") == 900
    assert f.cell(("edge", "json", 16), "p99", 0) == "30 [20-90]"
    assert f.spread(("edge", "json", 16)) == (1000 - 400) / 900


def test_targets_are_judged_on_medians_so_one_outlier_run_does_not_decide() -> None:
    figures = {
        **runs("upstream", "json", 1, [(9000, 0.1, 0.2)] * 3),
        # one run with a 60 ms p99 outlier; the median p99 is 0.9 ms, within 5x of 1.0 ms
        **runs("edge", "json", 1, [(800, 1.0, 0.9), (800, 1.0, 60.0), (800, 1.1, 0.8)]),
        **runs("proxy", "json", 16, [(1000, 5, 9)] * 3),
        **runs("edge", "json", 16, [(700, 6, 9), (800, 6, 9), (200, 6, 9)],
               cpu_ms={"edge": 0.14, "node": 0.09}),
    }  # fmt: skip
    checks = {c.what: c for c in core_checks(Figures(figures))}
    assert checks["json c=1 p99 within 5x its p50"].met
    assert checks["added p50 over the upstream, json c=1"].measured == "0.90 ms"
    ratio = checks["json c=16 req/s vs the one-hop proxy"]
    assert ratio.measured.startswith("0.70x") and not ratio.met
    assert checks["Edge (Node) CPU per json request, c=16"].met


def test_the_report_states_the_load_and_the_noise_of_the_upstream_cells() -> None:
    figures = {
        **runs("upstream", "json", 1, [(9000, 0.1, 0.2), (6000, 0.1, 0.2), (12000, 0.1, 0.2)],
               load1=2.5),
        **runs("edge", "json", 1, [(800, 1.0, 2.0)] * 3, load1=3.0),
    }  # fmt: skip
    header = {"rounds": 3, "seconds": 3.0, "pinning": "none", "elapsed_s": 1.0}
    text = render(Figures(figures), {}, header)["text"]
    assert "median 2.75, min 2.50, max 3.00" in text
    assert "- upstream: 67%" in text  # (12000 - 6000) / 9000
    assert "machine's own noise" in text


def test_loop_lag_per_run_is_the_difference_of_two_scrapes() -> None:
    before = {0.001: 5.0, 0.005: 8.0, 0.01: 8.0, 0.25: 8.0, float("inf"): 8.0}
    after = {0.001: 10.0, 0.005: 14.0, 0.01: 15.0, 0.25: 16.0, float("inf"): 16.0}
    lag = _lag_between(before, after)
    assert lag is not None
    assert (lag.samples, lag.over_5ms, lag.worst_le) == (8, 2, 0.25)


def test_the_scale_out_section_compares_medians_with_edge_cpu_summed_over_the_edges(
    monkeypatch,
) -> None:
    import bench_scale

    monkeypatch.setattr(bench_scale, "SKIPPED", [])
    monkeypatch.setattr(bench_scale, "AT_REST", {"scale-mem: edge": 1.0})
    one = {"edge": 0.3, "node-1": 0.1, "node-2": 0.1}
    two = {"edge-0": 0.4, "edge-1": 0.5, "node-1": 0.1, "node-2": 0.2}
    figures = {
        **runs("scale-redis", "json", 16, [(900, 5, 9), (1000, 4, 9), (100, 40, 90)],
               cpu_ms=one),
        **runs("scale-rr", "json", 16, [(1500, 6, 9)] * 3, cpu_ms=two),
    }  # fmt: skip
    lines = bench_scale.compare(Figures(figures))
    row = next(line for line in lines if line.startswith("| one Redis Edge → two"))
    assert row == (
        "| one Redis Edge → two (round robin) | 16 | 900 | 1500 | 1.67x | 5.00 | 6.00 | +1.00 "
        "| 0.30 → 0.90 | 0.20 → 0.30 |"
    )
    assert not any("in memory → Redis" in line for line in lines)  # no baseline run: no row
    assert "scale-mem: edge 1.0" in lines[-1]


def test_scale_out_cells_skipped_say_why_in_the_report(monkeypatch) -> None:
    import bench_scale

    monkeypatch.setattr(bench_scale, "SKIPPED", ["Redis at 127.0.0.1:1 does not answer"])
    header = {"rounds": 3, "seconds": 3.0, "pinning": "none", "elapsed_s": 1.0}
    text = render(Figures(runs("edge", "json", 1, [(800, 1.0, 2.0)] * 3)), {}, header)["text"]
    assert "## Scale-out\n\nSkipped: Redis at 127.0.0.1:1 does not answer." in text


def test_the_scale_out_check_names_the_redis_that_does_not_answer() -> None:
    import bench_scale

    from tests.support import free_port

    port = free_port()  # nothing listens there
    reason = bench_scale.unavailable(f"redis://:secret@127.0.0.1:{port}/0", "postgresql://x/")
    assert reason is not None
    assert f"Redis at 127.0.0.1:{port} does not answer" in reason
    assert "secret" not in reason
