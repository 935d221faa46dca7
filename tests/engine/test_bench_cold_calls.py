"""``experiments/bench_cold_calls.py``: every call kind measured under every condition, one JSON line each, positive
times (``aot_eager``: the trace without code generation); bad counts refused in one line."""

from __future__ import annotations

import json

import pytest

from experiments import bench_cold_calls


@pytest.mark.slow
def test_every_call_under_every_condition(tmp_path):
    out = tmp_path / "cold.jsonl"
    bench_cold_calls.main(["--window", "4", "--sweep-mb", "1", "--calls", "2", "--rounds", "1", "--backend", "aot_eager", "--json", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["call"] for row in rows] == ["compiled x + 1", "noise draw", "judge, compiled", "judge, eager"]
    for row in rows:
        assert all(row[condition] > 0 for condition in bench_cold_calls.CONDITIONS), row
        assert row["decoder_mb"] > 1 and row["window"] == 4


@pytest.mark.parametrize("flag", ["--calls", "--rounds", "--window"])
def test_bad_counts_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        bench_cold_calls.main([flag, "1" if flag == "--window" else "0"])
    assert flag in capsys.readouterr().err
