"""How a window forward's cost grows with the cache, at a real model's width (docs/PERFORMANCE.md, "Scale").

On the rehearsal's real shape (``model.random_init=true model.layers=K``, docs/MODELS.md "Rehearsal"; no file read),
one ``csd.ragged.SlotBatch`` of ``B`` images at a time holds a cache of ``L`` entries per CFG row, for ``L`` from a
few hundred up to a long image's ~9,400 positions, and each window of the engine's kinds is fed ``--reps`` times:

- ``ar``: one entry a row (AR, every method's AR tail), the causal path (its mask is a gather from the cache's causal
  table, ``L^2`` entries);
- ``sjd``: a Jacobi chain of ``--window`` entries, the causal path;
- ``pjd``: ``--rows`` chains of ``--window`` entries on shifted position ids with row groups (PJD's row-causal path:
  the mask is built from every entry's recorded position id).

A window's cost at ``L`` does not depend on what the cache holds, so the rows are filled by setting their lengths (the
keys are zeros), not by a prefill of ``L`` tokens. The figure per ``L`` is the median wall time of a forward (after
one untimed), with the causal table's bytes and the time to build it; the reading is the log-log slope of the time
against ``L`` (1: linear in the cache, as attention over it; 2: quadratic). CPU or GPU (``--device``).

    python -m experiments.bench_scale --model janus_pro_7b --layers 1 --batch-sizes 1 4 \\
        --lengths 256 1024 2048 4096 9400 --json results/bench/scale_janus_pro_7b_cpu.jsonl
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from csd.compose import build_adapter
from csd.device import resolve_device, synchronize
from csd.presets import CONF_DIR
from csd.ragged import SlotBatch

KINDS = ("ar", "sjd", "pjd")
CAPTION = "A man riding a wave on top of a surfboard."


def window(kind: str, batch: int, fill: int, width: int, rows: int, vocab: int, device: torch.device
           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``ids [B, q]`` of a ``kind`` window and its ``SlotBatch.forward`` keywords (PJD: the shift that puts entry
    ``j`` at position id ``fill + j`` and its chain's group, chains of ``width`` entries, each sharing its first)."""
    q = {"ar": 1, "sjd": width, "pjd": rows * width}[kind]
    ids = torch.randint(0, vocab, (batch, q), device=device)
    if kind != "pjd":
        return ids, {}
    shift = torch.zeros((batch, q), dtype=torch.long, device=device)
    groups = (torch.arange(q, device=device) // width + 1).repeat(batch, 1)
    groups[:, ::width] = 0  # each chain's anchor is shared, as a committed token
    return ids, {"shift": shift, "groups": groups}


def time_forwards(state: SlotBatch, ids: torch.Tensor, kwargs: dict[str, torch.Tensor], fill: int, reps: int,
                  device: torch.device) -> float:
    """Median seconds of ``reps`` forwards of ``ids`` on rows of ``fill`` entries (one untimed first), each rolled back."""
    times = []
    slots = ids.shape[0]
    for rep in range(reps + 1):
        state.cache.rollback([f - fill for f in state.cache.filled])
        synchronize(device)
        start = time.perf_counter()
        state.forward(ids, [False] * slots, [True] * slots, **kwargs)
        synchronize(device)
        if rep:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model: str, layers: int, batch: int, lengths: list[int], width: int, rows: int, reps: int,
            dtype: str, device: torch.device) -> list[dict[str, Any]]:
    """One row per (window kind, L): median ms of a forward, the causal table's MB and build ms."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", "++model.random_init=true", f"++model.layers={layers}",
                                           f"model.dtype={dtype}"])
    adapter = build_adapter(cfg.model, device)
    state = SlotBatch(adapter, batch)
    for slot in range(batch):
        state.prefill(slot, CAPTION)
    q_max = rows * width
    state.cache.grow(max(lengths) + q_max)
    out = []
    for fill in lengths:
        state.cache.rollback(list(state.cache.filled))  # every row empty, then ``fill`` entries (their keys: zeros)
        state.cache.advance(slice(0, state.cache.rows), fill, [True] * state.cache.rows)
        for kind in KINDS:
            ids, kwargs = window(kind, batch, fill, width, rows, adapter.vocab_size, device)
            seconds = time_forwards(state, ids, kwargs, fill, reps, device)
            out.append({"model": model, "layers": layers, "batch": batch, "kind": kind, "q": ids.shape[1],
                        "cache_entries": fill, "ms": 1e3 * seconds, "dtype": dtype, "device": str(device),
                        "hidden": adapter.decoder().config.hidden_size, "host": platform.node(),
                        "torch": torch.__version__})
    capacity = state.cache.capacity
    state.cache._causal = None
    start = time.perf_counter()
    table = state.cache.causal_masks()
    synchronize(device)
    for row in out:
        row["causal_table_mb"] = table.numel() * table.element_size() / 2**20
        row["causal_table_build_ms"] = 1e3 * (time.perf_counter() - start)
        row["capacity"] = capacity
    return out


def slopes(rows: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    """Per (B, kind): the least-squares slope of log(ms) against log(cache entries)."""
    out = {}
    for key in sorted({(r["batch"], r["kind"]) for r in rows}):
        pts = [(math.log(r["cache_entries"]), math.log(r["ms"])) for r in rows if (r["batch"], r["kind"]) == key]
        x, y = np.array(pts).T
        out[key] = float(np.polyfit(x, y, 1)[0])
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lengths = sorted({r["cache_entries"] for r in rows})
    head = "| B | window | " + " | ".join(f"L = {n}" for n in lengths) + " | log-log slope |"
    lines = [head, "|---|---|" + "---|" * (len(lengths) + 1)]
    fit = slopes(rows)
    for batch, kind in fit:
        ms = {r["cache_entries"]: r["ms"] for r in rows if (r["batch"], r["kind"]) == (batch, kind)}
        q = next(r["q"] for r in rows if (r["batch"], r["kind"]) == (batch, kind))
        lines.append(f"| {batch} | {kind} (q = {q}) | " + " | ".join(f"{ms[n]:.1f}" for n in lengths)
                     + f" | {fit[(batch, kind)]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="janus_pro_7b")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 1024, 2048, 4096, 9400])
    parser.add_argument("--window", type=int, default=16, help="entries of a Jacobi chain (SJD, PJD's rows)")
    parser.add_argument("--rows", type=int, default=4, help="PJD: chains in one forward")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", type=Path, help="append one line per (B, window, L)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    rows = []
    for batch in args.batch_sizes:
        part = measure(args.model, args.layers, batch, args.lengths, args.window, args.rows, args.reps, args.dtype,
                       device)
        rows += part
        if args.json:
            with args.json.open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in part)
    print(table(rows))
    cap = rows[-1]
    print(f"\ncausal table at capacity {cap['capacity']}: {cap['causal_table_mb']:.0f} MB, built in "
          f"{cap['causal_table_build_ms']:.0f} ms")
    return rows


if __name__ == "__main__":
    main()
