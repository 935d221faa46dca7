"""``experiments/bench_guards.py``: the guard check of the compiled step, all guards against the kept ones, on a
two-layer toy-layout LM: the filter is the one ``csd.fast.compile_step`` installs (restored after), it drops most
guards, and fewer guards cost less to check."""

from __future__ import annotations

import json

import pytest
import torch

from experiments import bench_guards


@pytest.mark.slow
def test_kept_guards_are_fewer_and_the_filter_is_restored(tmp_path):
    skip = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    out = tmp_path / "guards.jsonl"
    bench_guards.main(["--layers", "1,2", "--calls", "50", "--json", str(out)])
    assert torch.compiler.skip_guard_on_all_nn_modules_unsafe is skip
    one, two = (json.loads(line) for line in out.read_text().splitlines())
    assert one["guards"] < two["guards"]  # one set of module-tree guards per layer
    for row in (one, two):
        assert 0 < row["kept"] < row["guards"] / 2 and row["us_kept"] > 0 and row["us_all"] > 0
