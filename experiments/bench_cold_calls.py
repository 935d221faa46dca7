"""What the engine's small calls cost between model forwards on a CPU: warm, and after the caches were swept.

On a CPU the model forward and the engine share the core's caches: a forward streams every weight through them (the
toy's decoder: 11.7 MB of fp32 parameters, against 1 MB of L2 per core on this VM), so each of the engine's calls
after it starts cold, its Python objects, dispatcher tables and data fetched again from L3 or memory. This measures,
one thread, CPU time per call (``time.thread_time``), the median of ``--rounds`` means of ``--calls`` calls:

- ``compiled x + 1``: a trivial compiled function (dynamo's guard check and the generated wrapper alone);
- ``noise draw``: a window's random numbers (``csd.verify.WindowNoise.draw``, ``[1, L, V]``);
- ``judge, compiled``: the verification of one full window (``csd.drafters.chain.judge_windows`` of CSD, ``--backend``,
  the rule's parameters as tensors as the compiled engine passes them);
- ``judge, eager``: the same function eagerly;

each ``warm`` (back to back), after a sweep of ``--sweep-mb`` MB of memory (a multiply in place), and after one
forward of the toy's decoder on ``L`` tokens (``after forward``: the engine's situation). The forward and the sweep are
outside the timed calls.

    python -m experiments.bench_cold_calls --json results/bench/cold_calls_toy_cpu.jsonl

Prints a table; ``--json FILE`` appends one line per call kind.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CONDITIONS = ("warm", "after sweep", "after forward")


def per_call_us(call: Callable[[], object], before: Callable[[], object] | None, calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean CPU time of ``call`` in microseconds, ``before`` run (untimed) before each."""
    means = []
    for _ in range(rounds):
        total = 0.0
        for _ in range(calls):
            if before is not None:
                before()
            start = time.thread_time()
            call()
            total += time.thread_time() - start
        means.append(total / calls * 1e6)
    return statistics.median(means)


def call_kinds(adapter: Any, window: int, backend: str) -> dict[str, Callable[[], object]]:
    """The calls measured, on ``adapter``'s device and image vocabulary, compiled with ``backend`` and called three times
    (compiled, allocator settled): a trivial compiled function, a window's noise draw, the compiled verification of
    one full CSD window (as the compiled engine calls it: ``CompiledStep.compile``, the rule's parameters as tensors)
    and the same verification eagerly."""
    from csd.acceptance import CSD, entropy
    from csd.drafters.chain import judge_windows
    from csd.fast import CompiledStep
    from csd.verify import WindowNoise

    device, vocab = adapter.device, adapter.vocab_size
    gen = torch.Generator(device=device).manual_seed(0)
    target = torch.softmax(3 * torch.randn((1, window, vocab), generator=gen, device=device), -1)
    draft_probs = torch.softmax(3 * torch.randn((1, window - 1, vocab), generator=gen, device=device), -1)
    noise = WindowNoise.draw(1, window, vocab, gen, device)
    args = (CSD().with_tensor_params(device), target, entropy(target), draft_probs.argmax(-1), draft_probs, None,
            noise, None)
    judge = CompiledStep(adapter, backend=backend).compile(judge_windows)
    plus_one = torch.compile(lambda x: x + 1, backend=backend, dynamic=False)
    one = torch.ones(3, device=device)
    kinds: dict[str, Callable[[], object]] = {
        "compiled x + 1": lambda: plus_one(one),
        "noise draw": lambda: WindowNoise.draw(1, window, vocab, gen, device),
        "judge, compiled": lambda: judge(*args),
        "judge, eager": lambda: judge_windows(*args),
    }
    for call in kinds.values():
        for _ in range(3):
            call()
    return kinds


def measure_calls(kinds: dict[str, Callable[[], object]], befores: dict[str, Callable[[], object] | None], calls: int,
                  rounds: int) -> list[dict[str, Any]]:
    """Per call kind, the host CPU time per call (:func:`per_call_us`) under every condition (name -> what runs,
    untimed, before each call; None: nothing)."""
    return [{"call": name, **{condition: per_call_us(call, before, calls, rounds) for condition, before in befores.items()}}
            for name, call in kinds.items()]


def measure(window: int, sweep_mb: float, calls: int, rounds: int, backend: str = "inductor") -> list[dict[str, Any]]:
    """Every call kind under every condition (:data:`CONDITIONS`), on the toy, CPU, one thread."""
    from csd.adapters.toy import load_toy_adapter

    torch.set_num_threads(1)
    adapter = load_toy_adapter()
    kinds = call_kinds(adapter, window, backend)
    sweep = torch.ones(int(sweep_mb * 2**20 / 4))
    decoder = adapter.decoder()
    ids = torch.randint(0, 100, (1, window))

    def forward() -> None:
        with torch.no_grad():
            decoder(input_ids=ids)

    befores: dict[str, Callable[[], object] | None] = {
        "warm": None, "after sweep": lambda: sweep.mul_(1.0), "after forward": forward}
    decoder_mb = sum(p.numel() * p.element_size() for p in decoder.parameters()) / 2**20
    meta = {"backend": backend, "window": window, "vocab": adapter.vocab_size, "sweep_mb": sweep_mb,
            "decoder_mb": round(decoder_mb, 2)}
    return [{**row, **meta} for row in measure_calls(kinds, befores, calls, rounds)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_cold_calls", description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--sweep-mb", type=float, default=12.0, help="memory swept before each call (the toy's decoder: 11.7)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager", "eager"),
                        help="the compiled calls' torch.compile backend")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for name, value in (("--window", args.window), ("--calls", args.calls), ("--rounds", args.rounds)):
        if value < 1 + (name == "--window"):
            parser.error(f"{name} {value}: must be >= {1 + (name == '--window')}")
    rows = measure(args.window, args.sweep_mb, args.calls, args.rounds, args.backend)
    print("| call | us warm | us after sweep | us after forward | after forward / warm |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['call']} | {row['warm']:.1f} | {row['after sweep']:.1f} | {row['after forward']:.1f} | "
              f"{float(row['after forward']) / float(row['warm']):.1f} |", flush=True)
        if args.json is not None:
            with args.json.open("a") as out:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
