"""Paired speed of drafters on the toy: ms per engine iteration and images/s per (drafter, batch size).

Each spec ``name:key=value,...`` (a drafter of ``conf/drafter/`` with its keys) decodes ``--images`` toy
held-out captions (image ``i``: caption ``i``, seed ``i``) with SJD's rule at every batch size, after one untimed
warm-up image; ms per iteration = wall time of the pass / engine iterations (forwards), so batch 1 and B = 16 read
the same way. ``--rounds`` repeats every (spec, B) in turn, so slow spells of a shared machine fall on every spec.
Only the public engine API and the drafters' config files are used, so the same file measures an older checkout too (``--checkout DIR``: csd is
imported from DIR; ``PYTHONPATH`` cannot do it, since ``python -m`` puts the repository root first on ``sys.path``):
a before / after pair is two runs of it, alternated, on the same machine. One thread (``torch.set_num_threads(1)``),
CPU.

    python -m experiments.bench_drafters --specs chain:window=8 pjd:window=8,context=8 --batch-sizes 1,16 --images 16

Prints a table; ``--json FILE`` appends one line per measurement (label, spec, B, round, iterations, seconds, tokens).
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from experiments._checkout import use_checkout

# csd is imported inside the functions, after ``--checkout`` chose where from


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,...`` -> the drafter's name and its keys (ints where they parse)."""
    name, _, keys = spec.partition(":")
    values: dict[str, Any] = {}
    for pair in filter(None, keys.split(",")):
        key, _, value = pair.partition("=")
        values[key] = int(value) if value.lstrip("-").isdigit() else value
    return name, values


def drafter(checkout: Path, name: str, keys: dict[str, Any]) -> Any:
    """The drafter ``conf/drafter/<name>.yaml`` of ``checkout`` names (its ``_target_``) with ``keys``."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    return get_class(OmegaConf.load(checkout / "conf" / "drafter" / f"{name}.yaml")._target_)(**keys)


def measure(checkout: Path, adapter: Any, spec: str, batch: int, images: int, captions: list[str]) -> dict[str, float]:
    """One timed pass of ``images`` images at batch ``batch``: seconds, engine iterations, body tokens and the images'
    forwards (``nfe``, per image: step compression = tokens / nfe)."""
    from csd.acceptance import SJD
    from csd.engine import JacobiEngine, Request

    name, keys = parse_spec(spec)
    engine = JacobiEngine(adapter, SJD(), drafter(checkout, name, keys), batch_size=batch)
    engine.generate(captions[0], 0)  # warm-up (untimed)
    iterations = 0
    step = engine._iteration

    def counted(*args: Any) -> list[int]:
        nonlocal iterations
        iterations += 1
        return step(*args)

    engine._iteration = counted
    requests = [Request(captions[i % len(captions)], i, i) for i in range(images)]
    start = time.perf_counter()
    gens = [gen for _, gen in engine.generate_many(requests)]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "iterations": iterations, "tokens": sum(g.tokens.numel() for g in gens),
            "nfe": sum(g.nfe for g in gens)}


def summary(rows: list[dict[str, Any]], specs: list[str], images: int, rounds: int) -> str:
    """Per batch size and drafter, over all rounds: seconds per image (the pass's wall time / its images), the
    speed-up against the first spec (the ratio of their summed times over the same images and rounds: paired, since
    every round times every spec in turn) and the step compression (tokens / forwards)."""
    lines = [f"{images} images x {rounds} rounds per (drafter, B), rounds alternating; speed-up: time of `{specs[0]}` / "
             "time of the drafter, same images, summed over rounds.", "",
             "| drafter | B | s / image | speed-up | step compression |", "|---|---|---|---|---|"]
    for batch in dict.fromkeys(row["batch"] for row in rows):
        total = {spec: [row for row in rows if row["spec"] == spec and row["batch"] == batch] for spec in specs}
        base = sum(row["seconds"] for row in total[specs[0]]) if total[specs[0]] else None
        for spec, mine in total.items():
            if not mine:
                continue
            seconds = sum(row["seconds"] for row in mine)
            ratio = "" if base is None else f"{base / seconds:.2f}"
            compression = sum(row["tokens"] for row in mine) / sum(row["nfe"] for row in mine)
            lines.append(f"| `{spec}` | {batch} | {seconds / (images * len(mine)):.3f} | {ratio} | {compression:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_drafters",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", required=True, help="drafters as name:key=value,...")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--label", default="")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--summary", type=Path, default=None,
                        help="write a markdown table: s / image and speed-up against the first spec, per B")
    parser.add_argument("--checkout", type=Path, default=None,
                        help="measure the csd of this checkout (an older one) instead of this repository's")
    args = parser.parse_args()
    checkout = use_checkout(args.checkout, parser)
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    torch.set_num_threads(1)
    adapter = load_toy_adapter()
    captions = [p.text for p in toy_prompts(args.images)]
    print("| label | drafter | B | round | ms / iteration | images / s | step compression |\n|---|---|---|---|---|---|---|")
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for spec in args.specs:
                name, keys = parse_spec(spec)
                problem = drafter(checkout, name, keys).problem(batch, False)
                if problem is not None:  # e.g. a tree drafter at B > 1: nothing to measure
                    print(f"| {args.label} | {spec} | {batch} | {r} | {problem} | | |", flush=True)
                    continue
                row = measure(checkout, adapter, spec, batch, args.images, captions)
                rows.append({"spec": spec, "batch": batch, **row})
                ms = 1000 * row["seconds"] / row["iterations"]
                print(f"| {args.label} | {spec} | {batch} | {r} | {ms:.2f} | {args.images / row['seconds']:.3f} | "
                      f"{row['tokens'] / row['nfe']:.2f} |", flush=True)
                if args.json is not None:
                    with args.json.open("a") as out:
                        out.write(json.dumps({"label": args.label, "spec": spec, "batch": batch, "round": r, **row}) + "\n")
    if args.summary is not None:
        args.summary.write_text(summary(rows, args.specs, args.images, args.rounds) + "\n")


if __name__ == "__main__":
    main()
