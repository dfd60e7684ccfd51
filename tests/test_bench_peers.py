"""`make bench` sets other gateways beside the Edge (docs/performance-history.md, "Against other
gateways"): the peers' section and targets are computed from medians of the same rounds. Figures
here are made up; nothing is timed and no peer runs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_peers
from bench_client import Probe
from bench_frames import Frames
from bench_rate import Search, Step
from bench_report import Figures, core_checks, render

from tests.test_bench_report import runs

HEADER = {"rounds": 3, "seconds": 3.0, "pinning": "none", "elapsed_s": 1.0}


def figures() -> Figures:
    """Upstream alone, our one-core Edge+Node, Portkey and LiteLLM (req/s, p50, p99)."""
    return Figures(
        {
            **runs("upstream", "json", 1, [(9000, 0.02, 0.1)] * 3),
            **runs("upstream", "stream", 1, [(5000, 0.10, 0.3)] * 3, ttfb_s=[0.0001] * 5),
            **runs("upstream", "json", 16, [(50000, 0.2, 0.5)] * 3),
            **runs("edge-1core", "json", 1, [(900, 0.82, 2.0), (700, 1.02, 3.0), (950, 0.80, 9.0)]),
            **runs("edge-1core", "stream", 1, [(600, 1.1, 3.0)] * 3, ttfb_s=[0.0009] * 5),
            **runs("edge-1core", "json", 16, [(2100, 7, 20), (1900, 8, 20), (2500, 6, 20)],
                   cpu_ms={"edge": 0.25, "node": 0.15}),
            **runs("portkey", "json", 1, [(1000, 0.92, 2.0)] * 3),
            **runs("portkey", "stream", 1, [(40, 30.0, 40.0)] * 3, ttfb_s=[0.0301] * 5),
            **runs("portkey", "json", 16, [(1000, 16, 40), (1100, 15, 40), (900, 17, 40)],
                   cpu_ms={"portkey": 0.9}),
            **runs("litellm", "json", 16, [(90, 170, 300)] * 3, cpu_ms={"litellm": 11.0}),
        }
    )  # fmt: skip


def test_the_peers_section_sets_each_gateway_beside_the_edge_from_the_same_rounds() -> None:
    lines = bench_peers.peers_table(figures())
    table = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    # req/s json c=16 | CPU ms/req | added p50 json c=1 over the upstream's | TTFB | p50 stream
    assert table["| edge-1core"] == (
        "| edge-1core | 2100 | edge 0.25 + node 0.15 | 0.80 | 0.80 | 1.00 |"
    )
    assert table["| portkey"] == "| portkey | 1000 | portkey 0.90 | 0.90 | 30.00 | 29.90 |"
    assert table["| litellm"] == "| litellm | 90 | litellm 11.00 | - | - | - |"
    assert "| edge |" not in "\n".join(lines)  # no core cells ran: no row for them


def test_the_targets_against_the_peers_are_judged_on_same_run_medians() -> None:
    checks = {c.what: c for c in bench_peers.peer_checks(figures())}
    latency = checks["added p50 at c=1, json (edge-1core) vs Portkey"]
    assert (latency.measured, latency.met) == ("0.80 vs 0.90 ms", True)
    first_byte = checks["added first byte at c=1, stream (edge-1core) vs Portkey"]
    assert first_byte.met and first_byte.measured == "0.80 vs 30.00 ms"
    times = checks["json c=16 req/s on one core vs portkey"]
    assert (times.measured, times.goal, times.met) == ("2.10x (2100 vs 1000)", ">= 4x", False)
    lite = checks["json c=16 req/s on one core vs litellm"]
    assert (lite.measured, lite.met) == ("23.33x (2100 vs 90)", False)  # 30x is the target
    # added over the upstream alone at c=1: p50 0.82 - 0.02, p99 3.0 - 0.1 (medians)
    p50 = checks["added p50 at c=1, json (edge-1core)"]
    assert (p50.measured, p50.goal, p50.met) == ("0.80 ms", "<= 0.6 ms", False)
    p99 = checks["added p99 at c=1, json (edge-1core)"]
    assert (p99.measured, p99.goal, p99.met) == ("2.90 ms", "<= 2.0 ms", False)
    cpu = checks["Edge (Node) CPU per json request, c=16 (edge-1core)"]
    assert (cpu.measured, cpu.goal, cpu.met) == (
        "0.25 ms (Node 0.15 ms)",
        "<= 0.15 ms (Node <= 0.10 ms)",
        False,
    )


def test_the_sustained_rate_is_set_beside_portkeys(monkeypatch) -> None:
    def search(*steps: tuple[float, float]) -> Search:
        return Search([Step(rate, 10, [p99] * 10, 0, 1.0) for rate, p99 in steps])

    rates = {
        "edge-1core": search((100, 1.0), (200, 2.0), (400, 30.0), (300, 9.0)),
        "portkey": search((100, 3.0), (200, 25.0), (150, 19.0)),
    }
    monkeypatch.setattr(bench_peers, "RATES", rates)
    checks = {c.what: c for c in bench_peers.peer_checks(Figures({}))}
    rate = checks["sustained req/s at p99 < 20 ms on one core vs Portkey"]
    assert (rate.measured, rate.met) == ("300 vs 150", True)
    table = "\n".join(bench_peers.peers_table(Figures({})))
    assert "| edge-1core | 300 | 100: 1.0, 200: 2.0, 400: 30.0, 300: 9.0 | 1.0-1.0 |" in table


def test_the_added_delay_per_frame_is_the_gateways_gaps_minus_the_upstreams(
    monkeypatch,
) -> None:
    frames = {
        "upstream": Frames([0.0] * 98 + [5.0, 50.0], [1.0, 2.0], [1.0, 1.5]),
        "edge-1core": Frames([0.0] * 49 + [40.0] * 49 + [300.0] * 2, [20.0, 24.0], [1.0, 1.2]),
    }
    monkeypatch.setattr(bench_peers, "FRAMES", frames)
    checks = {c.what: c for c in bench_peers.peer_checks(Figures({}))}
    frame = checks["added delay per streamed frame (edge-1core)"]
    # mean: the median of the streams' means, 22 - 1.5; gap p50 40 - 0
    assert (frame.measured, frame.met) == ("mean 20.5 µs (median gap +40.0 µs)", True)
    table = "\n".join(bench_peers.peers_table(Figures({})))
    # gap p50, p99, mean; added p50, p99 (nearest rank: the upstream's 99th of 100 is 5), mean
    assert "| edge-1core | 40.0 | 300.0 | 22.0 | 40.0 | 295.0 | 20.5 | 1.0-1.2 |" in table


def test_a_peer_that_could_not_run_is_reported_with_the_reason(monkeypatch) -> None:
    monkeypatch.setattr(bench_peers, "SKIPPED", {"litellm": "pip install litellm[proxy] failed"})
    monkeypatch.setattr(bench_peers, "VERSIONS", {"portkey": "1.15.2, node v20.20.2"})
    f = figures()
    del f.runs[("litellm", "json", 16)]  # it did not run
    text = render(f, {}, HEADER)["text"]
    assert "## Against other gateways (medians, same rounds)" in text
    assert "- litellm skipped: pip install litellm[proxy] failed" in text
    assert "- portkey: 1.15.2, node v20.20.2" in text
    assert "json c=16 req/s on one core vs litellm" not in text  # no cells: no verdict


def test_no_peer_and_nothing_skipped_adds_no_section(monkeypatch) -> None:
    monkeypatch.setattr(bench_peers, "SKIPPED", {})
    only_edge = Figures(runs("edge", "json", 16, [(900, 5, 9)] * 3))
    assert bench_peers.peers_table(only_edge) == []
    assert bench_peers.peer_checks(only_edge) == []


def test_the_edge_cpu_target_states_the_node_beside_it() -> None:
    f = Figures(
        {
            **runs("proxy", "json", 16, [(1000, 5, 9)] * 3),
            **runs("edge", "json", 16, [(900, 6, 9)] * 3, cpu_ms={"edge": 0.31, "node": 0.18}),
        }
    )
    cpu = next(c for c in core_checks(f) if c.what == "Edge (Node) CPU per json request, c=16")
    assert (cpu.measured, cpu.goal, cpu.met) == (
        "0.31 ms (Node 0.18 ms)",
        "<= 0.15 ms (Node <= 0.10 ms)",
        False,
    )


def test_a_peer_probe_sends_the_peer_routing_headers() -> None:
    headers = (("x-portkey-provider", "openai"), ("x-portkey-custom-host", "http://h:1/v1"))
    probe = Probe("127.0.0.1", 8787, "/v1/chat/completions", b"{}", "bench", extra=headers)
    head = probe.request.split(b"\r\n\r\n")[0].decode().split("\r\n")
    assert "x-portkey-provider: openai" in head
    assert "x-portkey-custom-host: http://h:1/v1" in head
    assert "Authorization: Bearer bench" in head


def test_the_stepped_rates_double_while_they_hold_then_bisect() -> None:
    search = Search()
    offered = []
    p99_at = {100: 1.0, 200: 2.0, 400: 4.0, 800: 30.0, 600: 12.0, 700: 25.0, 650: 19.0}
    while (rate := search.next_rate()) is not None:
        offered.append(rate)
        search.steps.append(Step(rate, 10, [p99_at[rate]] * 10, 0, 1.0))
    assert offered == [100, 200, 400, 800, 600, 700, 650]  # three bisections after 800
    assert search.sustained == 650


def test_a_step_with_a_failed_or_unanswered_request_does_not_hold() -> None:
    assert not Step(100, 10, [1.0] * 10, 1, 1.0).held  # one answer not a 200
    assert not Step(100, 10, [1.0] * 9, 0, 1.0).held  # one not answered in the drain time
    assert Step(100, 10, [1.0] * 10, 0, 1.0).held
