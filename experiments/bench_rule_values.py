"""What a sweep of a rule's values costs on one compiled step: the compilations per value, on the toy, CPU.

The study's calibration (``stage=study``) and a sweep in one process decode with one engine per value of a rule's
parameter (CSD's ``lam``) on one compiled step (``engine.compile=true``, ``csd.fast.CompiledStep``). Per value, one
toy held-out caption (caption 0, seed 0) at batch 1, window ``--window``: the seconds of that image (wall clock and
the thread's CPU time), the graphs dynamo compiled during it (``unique_graphs``: the first value also compiles the
step's two shapes) and a digest of its tokens. ``--checkout DIR`` measures another checkout's ``csd`` (an older one:
only the public engine API is used), so a before / after is two runs of this file. Compile times depend on inductor's
caches on disk: ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` measures a cold start (what docs/PERFORMANCE.md reports).

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python -m experiments.bench_rule_values --json results/bench/rule_values_toy_cpu.jsonl
    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python -m experiments.bench_rule_values --checkout ../before --label before

Prints a table; ``--json FILE`` appends one line per value.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch

from experiments._checkout import use_checkout

# csd is imported inside the functions, after ``--checkout`` chose where from


def measure(values: list[float], window: int, backend: str) -> list[dict[str, float | int | str]]:
    """One engine per ``lam`` on one compiled step of the toy: per value, seconds, graphs compiled, token digest."""
    from csd.acceptance import CSD
    from csd.adapters.toy import load_toy_adapter
    from csd.drafters.chain import ChainDrafter
    from csd.engine import JacobiEngine
    from csd.fast import CompiledStep
    from csd.toy.domain import toy_prompts

    torch.set_num_threads(1)
    torch.compiler.reset()
    adapter = load_toy_adapter()
    compiled = CompiledStep(adapter, backend=backend)
    caption = toy_prompts(1)[0].text
    stats = torch._dynamo.utils.counters["stats"]
    rows = []
    for lam in values:
        engine = JacobiEngine(adapter, CSD(lam=lam), ChainDrafter(window=window), compiled=compiled)
        graphs, wall, cpu = stats["unique_graphs"], time.perf_counter(), time.thread_time()
        gen = engine.generate(caption, seed=0)
        rows.append({"lam": lam, "wall_s": time.perf_counter() - wall, "cpu_s": time.thread_time() - cpu,
                     "graphs": stats["unique_graphs"] - graphs, "nfe": gen.nfe,
                     "tokens": hashlib.sha256(gen.tokens.numpy().tobytes()).hexdigest()[:16]})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_rule_values", description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", default="0.1,0.5,1,2,5,10", help="CSD lam values, comma-separated")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager", "eager"))
    parser.add_argument("--checkout", type=Path, help="measure the csd of this checkout (an older one)")
    parser.add_argument("--label", default="")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        values = [float(v) for v in args.values.split(",")]
    except ValueError:
        parser.error(f"--values {args.values!r}: comma-separated numbers >= 0")
    use_checkout(args.checkout, parser)
    print("| label | lam | wall s | cpu s | graphs compiled | NFE | tokens |\n|---|---|---|---|---|---|---|")
    for row in measure(values, args.window, args.backend):
        print(f"| {args.label} | {row['lam']} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} | {row['graphs']} | "
              f"{row['nfe']} | {row['tokens']} |", flush=True)
        if args.json is not None:
            with args.json.open("a") as out:
                out.write(json.dumps({"label": args.label, "backend": args.backend, "window": args.window, **row}) + "\n")


if __name__ == "__main__":
    main()
