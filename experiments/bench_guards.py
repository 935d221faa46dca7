"""What a compiled step's call costs in dynamo guards, by model depth: all guards against the ones
``csd.fast.compile_step`` keeps.

Before a compiled function replays a graph, dynamo checks the guards recorded when it traced it; on the decode step
most of them watch the model's module tree (attributes, hooks, submodules, parameters: one set per decoder layer),
and ``compile_step`` skips those (docs/PERFORMANCE.md "Guards"). For each ``--layers`` depth, a randomly initialised LM
with the toy's layout and that many decoder layers is decoded by the engine (AR, the compiled step with the ``eager``
backend: the guards do not depend on the backend); on one mid-image call the graph's guard check is timed in a tight
loop of ``--calls`` checks, once with every guard and once with the kept ones, one thread, CPU time.

    python -m experiments.bench_guards --layers 4,16,30 [--calls 500] [--json FILE]

Prints a table (guards recorded, guards kept, us per check of each); ``--json FILE`` appends one line per depth.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


def check_cost(toy: Any, layers: int, calls: int, keep_all: bool) -> tuple[int, int, float]:
    """(guards recorded, guards kept, us per guard check) of the compiled step of an LM with the toy adapter ``toy``'s
    layout and ``layers`` layers."""
    from transformers import LlamaForCausalLM

    from csd.acceptance import SJD
    from csd.adapters.toy import ToyAdapter
    from csd.drafters.chain import ChainDrafter
    from csd.engine import JacobiEngine
    from csd.fast import CompiledStep, step_and_target
    from csd.toy.domain import toy_prompts

    config = copy.deepcopy(toy.lm.config)
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    adapter = ToyAdapter(LlamaForCausalLM(config), toy.tokenizer, toy.sampling)
    counted: list[tuple[int, int]] = []
    skip = torch.compiler.skip_guard_on_all_nn_modules_unsafe

    def counting(entries: list[Any]) -> list[bool]:
        kept = [True] * len(entries) if keep_all else skip(entries)
        counted.append((len(entries), sum(kept)))
        return kept

    torch.compiler.reset()
    torch.compiler.skip_guard_on_all_nn_modules_unsafe = counting  # compile_step's filter, counted
    try:
        compiled = CompiledStep(adapter, backend="eager")
    finally:
        torch.compiler.skip_guard_on_all_nn_modules_unsafe = skip
    step: Callable[..., torch.Tensor] = compiled.step_fn
    timed: list[float] = []
    seen = 0

    def timing_step(*args: Any) -> torch.Tensor:
        nonlocal seen
        seen += 1
        if seen == adapter.layout.length // 2:  # mid-image: the q = 1 graph, compiled on the first call
            names = ("step", "embed", "target", "rows", "ids", "cache", "tail", "anchored", "noise")
            frame = dict(zip(names, args, strict=True))
            (entry,) = _debug_get_cache_entry_list(step_and_target.__code__)
            assert entry.guard_manager.check(frame), "the timed frame must pass the graph's guards"
            start = time.thread_time()
            for _ in range(calls):
                entry.guard_manager.check(frame)
            timed.append((time.thread_time() - start) / calls * 1e6)
        return step(*args)

    compiled.step_fn = timing_step
    JacobiEngine(adapter, SJD(), ChainDrafter(window=1), compiled=compiled).generate(toy_prompts(1)[0].text, seed=0)
    ((recorded, kept),) = counted
    return recorded, kept, timed[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_guards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="4,16,30", help="comma-separated decoder depths")
    parser.add_argument("--calls", type=int, default=500, help="guard checks per timing")
    parser.add_argument("--json", type=Path, help="append one JSON line per depth")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from csd.adapters.toy import load_toy_adapter

    toy = load_toy_adapter()
    print("| layers | guards | kept | us / check, all | us / check, kept |\n|---|---|---|---|---|")
    for layers in (int(x) for x in args.layers.split(",")):
        recorded, _, all_us = check_cost(toy, layers, args.calls, keep_all=True)
        _, kept, kept_us = check_cost(toy, layers, args.calls, keep_all=False)
        print(f"| {layers} | {recorded} | {kept} | {all_us:.1f} | {kept_us:.1f} |", flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"layers": layers, "guards": recorded, "kept": kept, "us_all": round(all_us, 2),
                                    "us_kept": round(kept_us, 2), "calls": args.calls, "clock": "cpu"}) + "\n")


if __name__ == "__main__":
    main()
