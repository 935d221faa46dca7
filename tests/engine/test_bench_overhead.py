"""``experiments/bench_overhead.py``: one timed pass on the toy, eager and on the compiled path (the ``eager`` backend:
dynamo's trace without code generation), with either clock. The two paths decode the same tokens, the per-step times
add up to the pass, and every wrapper the pass puts on the engine, the batch class and the adapter is taken off again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from csd import fast
from csd.ragged import SlotBatch
from experiments import bench_overhead

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_eager_and_compiled_passes_decode_the_same_tokens_and_restore_what_they_wrap():
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    torch.set_num_threads(1)
    torch.compiler.reset()
    adapter = load_toy_adapter()
    captions = [p.text for p in toy_prompts(1)]
    methods = {name: SlotBatch.__dict__[name] for name in ("forward", "rollback", "keep")}
    rows = {}
    for compile_backend, clock in ((None, "wall"), ("eager", "cpu")):
        row = bench_overhead.measure(REPO, adapter, "sjd/chain:window=8", 1, 1, captions, compile_backend, clock)
        assert row["iterations"] > 0 and 0 < row["forward"] < row["seconds"]
        steps = row["steps"]
        assert set(steps) == set(bench_overhead.STEPS)
        assert all(steps[s] >= 0 for s in ("propose", "feed", "target", "verify", "commit"))
        assert row["forward"] + sum(steps.values()) == pytest.approx(row["seconds"])
        rows[compile_backend] = row
        if compile_backend is None:
            assert row["step_call"] is None
        else:  # the compiled step's call split into its graphs and the call's own cost, the graphs' timers removed
            assert 0 < row["step_call"] < row["forward"]
            graphs = [value for name, value in vars(fast).items() if name.startswith("__compiled_fn")]
            assert graphs and all(getattr(getattr(g, "__code__", None), "co_name", None) != "timed" for g in graphs)
        assert "decode_step" not in adapter.__dict__
        assert {name: SlotBatch.__dict__[name] for name in methods} == methods
    assert rows[None]["tokens"] == rows["eager"]["tokens"]
    assert rows[None]["iterations"] == rows["eager"]["iterations"]


def test_a_pair_side_sums_its_rounds_with_and_without_the_call():
    rounds = [{"seconds": 1.0, "forward": 0.8, "iterations": 100, "step_call": 0.05},
              {"seconds": 3.0, "forward": 2.6, "iterations": 300, "step_call": 0.15}]
    assert bench_overhead.side_summary(rounds) == "10.000, 8.500, 15.0%, 20.0%"
    eager = [{**row, "step_call": None} for row in rounds]
    assert bench_overhead.side_summary(eager) == "10.000, 8.500, 15.0%, -"
