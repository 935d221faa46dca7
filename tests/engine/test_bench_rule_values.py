"""``experiments/bench_rule_values.py``: one engine per ``lam`` on one compiled step of the toy (``aot_eager``, the
same trace as inductor without code generation): the first value compiles, the others replay its graphs, and every
value's line is written."""

from __future__ import annotations

import json

import pytest

from experiments import bench_rule_values


@pytest.mark.slow
def test_later_values_compile_nothing(tmp_path):
    out = tmp_path / "values.jsonl"
    bench_rule_values.main(["--values", "0.1,10", "--window", "4", "--backend", "aot_eager", "--json", str(out)])
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert (first["lam"], second["lam"]) == (0.1, 10.0)
    assert first["graphs"] >= 2 and second["graphs"] == 0  # the step's shapes and the verification, then none
    assert first["nfe"] > 0 and second["cpu_s"] > 0


def test_values_are_numbers():
    with pytest.raises(SystemExit):
        bench_rule_values.main(["--values", "0.1,x"])
