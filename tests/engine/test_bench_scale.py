"""``experiments/bench_scale.py``: its windows are the engine's kinds (PJD's with shared anchors and row groups), its
slope is the log-log fit (1 for time linear in the cache, 2 for quadratic), and a run writes one JSON line per (B,
window, cache length), each a positive time at the length it names."""

from __future__ import annotations

import json

import pytest
import torch

from experiments import bench_scale


def test_windows_are_the_engines_kinds() -> None:
    ar, _ = bench_scale.window("ar", 2, 100, 16, 4, 50, torch.device("cpu"))
    sjd, _ = bench_scale.window("sjd", 2, 100, 16, 4, 50, torch.device("cpu"))
    pjd, kw = bench_scale.window("pjd", 2, 100, 3, 2, 50, torch.device("cpu"))
    assert ar.shape == (2, 1) and sjd.shape == (2, 16) and pjd.shape == (2, 6)
    assert kw["groups"][0].tolist() == [0, 1, 1, 0, 2, 2] and not kw["shift"].any()


def test_the_slope_is_the_log_log_fit() -> None:
    rows = [{"batch": 1, "kind": "ar", "cache_entries": n, "ms": 0.5 * n} for n in (100, 1000, 10000)]
    rows += [{"batch": 1, "kind": "sjd", "cache_entries": n, "ms": 1e-3 * n * n} for n in (100, 1000, 10000)]
    fit = bench_scale.slopes(rows)
    assert fit[(1, "ar")] == pytest.approx(1.0) and fit[(1, "sjd")] == pytest.approx(2.0)


@pytest.mark.slow
def test_a_run_writes_a_line_per_window_and_length(tmp_path) -> None:
    """On the tiny Janus (the real widths' runs take minutes: docs/PERFORMANCE.md, "Scale")."""
    out = tmp_path / "scale.jsonl"
    bench_scale.main(["--model", "janus_pro_tiny", "--batch-sizes", "2", "--lengths", "64", "300", "--reps", "1",
                      "--window", "4", "--rows", "2", "--dtype", "float32", "--device", "cpu", "--json", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["kind"], r["cache_entries"]) for r in rows) == [
        (k, n) for k in ("ar", "pjd", "sjd") for n in (64, 300)]
    assert all(r["ms"] > 0 and r["hidden"] == 32 and r["batch"] == 2 for r in rows)
    assert {r["q"] for r in rows} == {1, 4, 8} and rows[0]["causal_table_mb"] > 0
