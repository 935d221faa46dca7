"""The engine's overhead on the toy: ms per iteration, ms inside the model forward, the share outside, by engine step.

Each method (``ar``, ``sjd``, ``csd``, or ``RULE/DRAFTER:key=value,...`` with RULE ``sjd`` or ``csd`` and a drafter
of ``conf/drafter/``) decodes ``--images`` toy held-out captions (image ``i``: caption ``i``, seed ``i``; at least
``B`` at batch size ``B``) at every batch size after one untimed warm-up image, one thread
(``torch.set_num_threads(1)``), CPU. Per iteration (wall time
of the pass / engine iterations, as ``experiments/bench_drafters.py``): ``ms/it``; ``forward``, the adapter's
``decode_step`` (prefills included: they are model forwards too); ``outside`` = 1 - forward / wall; and the wall time
outside the model by engine step (docs/ALGORITHMS.md "The engine loop"): ``propose``, ``feed`` (the batch forward's
inputs, positions and mask, ``SlotBatch.forward`` minus ``decode_step``), ``target`` (processors + entropy; on the
compiled path they run in the step's graph, inside ``forward``),
``verify``, ``refresh``, ``rollback``, ``commit`` (the engine's per-slot commits), ``start`` (a slot's prefill minus its
forward, and the finished image's record) and ``rest`` (everything else of the pass). The steps are timed by wrapping
the engine's, drafter's and batch's methods from the outside (a few microseconds per iteration), never in the hot path.

``--compile BACKEND`` measures the compiled path (``engine.compile=true``: the decode step and the verification of full
windows compiled, ``csd.fast.CompiledStep``; ``forward`` is then the compiled step, and ``call`` the part of it outside
its graphs: the compiled call's own cost, dynamo's guard check, frame and argument handling, with ``outside + call``
the share of the iteration outside the graphs and the prefills) after a warm-up that compiles every
shape (one fixed cache sized for the longest caption). ``--clock cpu`` times with the thread's CPU time instead of the
wall clock: on a shared virtual machine the hypervisor's steal time lands in wall-clock timings at random (it does not
in CPU time), and one thread does all the work.

Only the public engine API is used, so the same file measures another checkout (``--checkout DIR``: csd is imported
from DIR). ``--pair DIR`` runs this file ``--rounds`` times on this checkout and on DIR in alternating order
(subprocesses, one after the other), prints the after / before ratios and checks that both decoded the same tokens.

    python -m experiments.bench_overhead --methods ar sjd csd --batch-sizes 1,16 --images 6
    python -m experiments.bench_overhead --methods ar sjd csd --pair ../baseline-checkout --rounds 3
    python -m experiments.bench_overhead --methods ar sjd csd --batch-sizes 1 --compile inductor --clock cpu

Prints a table; ``--json FILE`` appends one line per measurement.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import functools
import hashlib
import inspect
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from experiments._checkout import use_checkout

# csd is imported inside the functions, after ``--checkout`` chose where from

STEPS = ("propose", "feed", "target", "verify", "refresh", "rollback", "commit", "start", "rest")
SHORTHANDS = {"ar": "sjd/chain:window=1", "sjd": "sjd/chain:window=16", "csd": "csd/chain:window=16"}


def parse_method(method: str) -> tuple[str, str, dict[str, Any]]:
    """``ar`` | ``sjd`` | ``csd`` | ``RULE/DRAFTER:key=value,...`` -> rule name, drafter name, drafter keys."""
    rule, _, spec = SHORTHANDS.get(method, method).partition("/")
    name, _, keys = spec.partition(":")
    values: dict[str, Any] = {}
    for pair in filter(None, keys.split(",")):
        key, _, value = pair.partition("=")
        values[key] = int(value) if value.lstrip("-").isdigit() else value
    return rule, name or "chain", values


def build(checkout: Path, method: str) -> tuple[Any, Any]:
    """The rule and the drafter (``conf/drafter/<name>.yaml`` of ``checkout``) of ``method``."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from csd.acceptance import CSD, SJD

    rule, name, keys = parse_method(method)
    rules = {"sjd": SJD, "csd": CSD}
    if rule not in rules:
        raise ValueError(f"rule {rule!r} of {method!r}: one of {sorted(rules)}")
    return rules[rule](), get_class(OmegaConf.load(checkout / "conf" / "drafter" / f"{name}.yaml")._target_)(**keys)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


class Timers:
    """Seconds per step, filled by wrappers around methods (``wrap``); ``forward`` is the model forward."""

    def __init__(self, clock: str = "wall") -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.clock = CLOCKS[clock]
        self.undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, key: str) -> None:
        """Replace ``owner.attr`` (an instance attribute shadowing the method, or a class's function) by a timed call
        of it; :meth:`restore` puts back what the wrappers replaced."""
        inner = getattr(owner, attr)
        seconds, clock = self.seconds, self.clock
        self.undo.append((owner, attr, owner.__dict__.get(attr)))

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[key] += clock() - start

        setattr(owner, attr, timed)

    def restore(self) -> None:
        for owner, attr, before in reversed(self.undo):
            if before is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, before)


def measure(checkout: Path, adapter: Any, method: str, batch: int, images: int, captions: list[str],
            compile_backend: str | None = None, clock: str = "wall") -> dict[str, Any]:
    """One timed pass: seconds, iterations, seconds per step, and a digest of every image's tokens."""
    import csd.engine as engine_module
    from csd.engine import JacobiEngine, Request
    from csd.ragged import SlotBatch

    rule, drafter = build(checkout, method)
    requests = [Request(captions[i % len(captions)], i, i) for i in range(images)]
    compiled = None
    if compile_backend is not None:  # one fixed cache for every caption: no shape changes after the warm-up
        from csd.cache import default_cache_len
        from csd.fast import CompiledStep

        body = adapter.layout.length
        longest = max(default_cache_len(max(map(len, adapter.prompt_inputs(r.prompt))) - 1, body) for r in requests)
        compiled = CompiledStep(adapter, longest, compile_backend)
    engine = JacobiEngine(adapter, rule, drafter, batch_size=batch, compiled=compiled)
    # warm-up (untimed): builds the engine's SlotBatch (reused by the eager path); compiled, the same images trace
    # every shape the timed pass meets
    list(engine.generate_many(requests if compiled is not None else requests[:1]))
    # the compiled path builds a SlotBatch per call: its methods are timed on the class
    state = engine._batch if compiled is None else SlotBatch
    timers = Timers(clock)
    now = timers.clock
    # outermost first: a step's own time is its wrapper's minus the inner wrappers' (the model forward)
    timers.wrap(engine, "_iteration", "iteration")
    timers.wrap(engine, "_start", "start_all")
    timers.wrap(engine, "_finish", "finish")
    timers.wrap(engine.drafter, "propose", "propose")
    timers.wrap(state, "forward", "feed_all")
    if compiled is None or "target" not in inspect.signature(type(compiled).__call__).parameters:
        timers.wrap(engine, "pipeline", "pipeline")  # else in the compiled step's graph: timed inside ``forward``
    timers.wrap(engine_module, "entropy", "entropy")
    timers.wrap(engine.drafter, "verify", "verify")
    timers.wrap(engine.drafter, "refresh", "refresh")
    timers.wrap(state, "rollback", "rollback_")
    timers.wrap(state, "keep", "keep")
    timers.wrap(engine, "_advance", "commit")
    graphs = []
    if compiled is None:
        timers.wrap(adapter, "decode_step", "forward")  # last: the innermost call
    else:
        timers.wrap(compiled, "step_fn", "forward")
        timers.wrap(adapter, "decode_step", "prefill")  # the compiled path's prefills run the eager step
        import csd.fast as fast_module

        # dynamo calls each compiled graph of the step through a global of the step's module: timing those splits the
        # step's call into its graph and the call's own cost (guard check, frame, argument handling)
        graphs = [name for name in vars(fast_module) if name.startswith("__compiled_fn")]
        for name in graphs:
            timers.wrap(fast_module, name, "graph")
    forward_in = {"feed": 0.0}
    feed_all = state.forward

    def feed(*args: Any, **kwargs: Any) -> Any:
        before = timers.seconds["forward"]
        out = feed_all(*args, **kwargs)
        forward_in["feed"] += timers.seconds["forward"] - before
        return out

    state.forward = feed
    iterations = 0
    step = engine._iteration

    def counted(*args: Any) -> list[int]:
        nonlocal iterations
        iterations += 1
        return step(*args)

    engine._iteration = counted
    try:
        start = now()
        gens = [gen for _, gen in engine.generate_many(requests)]
        seconds = now() - start
    finally:
        timers.restore()
    t = timers.seconds
    step_call = t["forward"] - t["graph"] if graphs else None
    t["forward"] += t["prefill"]
    prefill_forward = t["forward"] - forward_in["feed"]
    steps = {
        "propose": t["propose"], "feed": t["feed_all"] - forward_in["feed"], "target": t["pipeline"] + t["entropy"],
        "verify": t["verify"], "refresh": t["refresh"], "rollback": t["rollback_"] + t["keep"], "commit": t["commit"],
        "start": t["start_all"] - prefill_forward + t["finish"],
    }
    steps["rest"] = seconds - t["forward"] - sum(steps.values())
    digest = hashlib.sha256()
    for gen in gens:
        digest.update(gen.tokens.numpy().tobytes())
    return {"seconds": seconds, "iterations": iterations, "forward": t["forward"], "step_call": step_call, "steps": steps,
            "tokens": digest.hexdigest()[:16]}


def row_cells(row: dict[str, Any]) -> list[str]:
    """ms/it, forward ms/it, share outside, the compiled step's call cost (ms/it) and the share outside with it, then
    each step's ms/it."""
    per, call = 1000 / row["iterations"], row.get("step_call")
    return [f"{row['seconds'] * per:.3f}", f"{row['forward'] * per:.3f}", f"{1 - row['forward'] / row['seconds']:.1%}",
            "-" if call is None else f"{call * per:.3f}",
            "-" if call is None else f"{1 - (row['forward'] - call) / row['seconds']:.1%}",
            *(f"{row['steps'][s] * per:.3f}" for s in STEPS)]


HEADER = ("| label | method | B | round | ms/it | forward | outside | call | outside + call | " + " | ".join(STEPS)
          + " | tokens |")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    checkout = use_checkout(args.checkout, parser)
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    torch.set_num_threads(1)
    adapter = load_toy_adapter()
    captions = [p.text for p in toy_prompts(max(args.images, *(int(b) for b in args.batch_sizes.split(","))))]
    print(HEADER + "\n" + "|---" * (HEADER.count("|") - 1) + "|", flush=True)
    for r in range(args.rounds):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for method in args.methods:
                _, drafter = build(checkout, method)
                problem = drafter.problem(batch, False)
                if problem is not None:  # e.g. a tree drafter at B > 1
                    print(f"| {args.label} | {method} | {batch} | {r} | {problem} |", flush=True)
                    continue
                images = max(args.images, batch)  # at B > 1 every slot decodes an image
                row = measure(checkout, adapter, method, batch, images, captions, args.compile, args.clock)
                print(f"| {args.label} | {method} | {batch} | {r} | " + " | ".join(row_cells(row)) + f" | {row['tokens']} |",
                      flush=True)
                if args.json is not None:
                    with args.json.open("a") as out:
                        out.write(json.dumps({"label": args.label, "method": method, "batch": batch, "round": r,
                                              "images": images, "compile": args.compile, "clock": args.clock,
                                              **row}) + "\n")


def side_summary(side: list[dict[str, Any]]) -> str:
    """One side of a pair over its rounds: ms per iteration, forward ms per iteration, the share outside the forward and
    the share outside the compiled graphs (``-`` when a round has no ``step_call``: the eager path)."""
    wall = sum(row["seconds"] for row in side)
    forward = sum(row["forward"] for row in side)
    its = sum(row["iterations"] for row in side)
    calls = [row.get("step_call") for row in side]
    with_call = "-" if None in calls else f"{1 - (forward - sum(calls)) / wall:.1%}"
    return f"{1000 * wall / its:.3f}, {1000 * forward / its:.3f}, {1 - forward / wall:.1%}, {with_call}"


def pair(args: argparse.Namespace) -> None:
    """``--rounds`` rounds of this checkout (``after``) and ``--pair`` (``before``) in alternating order; the after /
    before ratios of every round and the check that both decoded the same tokens."""
    common = ["--methods", *args.methods, "--batch-sizes", args.batch_sizes, "--images", str(args.images),
              "--clock", args.clock, *(["--compile", args.compile] if args.compile else [])]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        for r in range(args.rounds):
            order = [("after", None), ("before", args.pair)]
            for label, checkout in order if r % 2 == 0 else order[::-1]:
                command = [sys.executable, "-m", "experiments.bench_overhead", *common, "--label", label, "--json", str(out)]
                subprocess.run(command + ([] if checkout is None else ["--checkout", str(checkout)]), check=True)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    if args.json is not None:
        with args.json.open("a") as dest:
            for row in rows:
                dest.write(json.dumps(row) + "\n")
    by_key: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_key[(row["method"], row["batch"])][row["label"]].append(row)
    print("\n| method | B | after / before ms/it (per round) | before: ms/it, forward, outside, outside + call | after: "
          "ms/it, forward, outside, outside + call | tokens equal |\n|---|---|---|---|---|---|")
    mismatch = []
    for (method, batch), sides in by_key.items():
        before, after = sides["before"], sides["after"]
        ratios = [a["seconds"] / a["iterations"] / (b["seconds"] / b["iterations"]) for a, b in zip(after, before, strict=True)]
        same = {row["tokens"] for row in before + after}
        if len(same) != 1:
            mismatch.append((method, batch))

        print(f"| {method} | {batch} | {', '.join(f'{x:.3f}' for x in ratios)} | {side_summary(before)} | {side_summary(after)} | "
              f"{'yes' if len(same) == 1 else 'NO'} |")
    if mismatch:
        raise SystemExit(f"before and after decoded different tokens: {mismatch}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["ar", "sjd", "csd"],
                        help="ar, sjd, csd, or RULE/DRAFTER:key=value,... (RULE sjd or csd)")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--label", default="")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--checkout", type=Path, default=None,
                        help="measure the csd of this checkout (an older one) instead of this repository's")
    parser.add_argument("--compile", default=None, choices=["inductor", "aot_eager", "eager"],
                        help="measure the compiled path (engine.compile=true) with this torch.compile backend")
    parser.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                        help="wall: elapsed time; cpu: the thread's CPU time (steal time of a shared VM left out)")
    parser.add_argument("--pair", type=Path, default=None,
                        help="before / after: alternate runs of this checkout and of this one, compare their tokens")
    args = parser.parse_args()
    if args.pair is not None:
        if args.checkout is not None:
            parser.error("--pair runs this checkout against --pair's: no --checkout with it")
        pair(args)
    else:
        run(args, parser)


if __name__ == "__main__":
    main()
