"""The memory plan against what a decode allocates, per component, on the rehearsal's real shapes (docs/MODELS.md,
"Rehearsal"; docs/PERFORMANCE.md, "Memory plan, measured").

For a ``model=`` preset with ``K`` decoder layers of random weights and ``B`` images at once, the planner's figure
(``csd.plan.plan_memory``) next to the measured one:

- ``weights``: the bytes of every parameter and buffer the built model holds (its tensors' storages);
- ``kv_cache``: the bytes of the cache's key and value buffers after the batch's prompts (``RaggedCache``, eager: sized
  by ``csd.cache.default_cache_len`` of the longest prompt);
- ``mask_table``: the cache's causal-mask table (built by the first causal window);
- ``prefill``: the resident-memory peak above the start of one slot's prefill, less the cache buffers it grew (the
  first prefill sizes the cache: ``kv_cache``): the larger of a second and a third prefill (``first_prefill``: the
  first, which also makes the process's one-time allocations: libraries' workspaces, lazily built tables);
- ``iteration``: the resident-memory peak above the start of one engine iteration (every slot's window forward, the
  target, verification, the drafter's refresh), the largest of iterations 2 .. ``--iterations`` (``first_iteration``:
  the first, which also allocates the drafter's state). The planner's figure is ``B x activation_bytes`` at the
  largest cache length the iterations saw (the plan itself bounds it at the full cache).

Peaks are Linux's resident high-water mark (``VmHWM``), reset before each measured step (``/proc/self/clear_refs``),
with glibc told to map every block of 64 KiB or more and return it when freed (``mallopt``), so the peak is the step's
own allocations, not what an earlier step left on the heap; each (model, K, B) runs in a fresh interpreter. Pages the
step allocates but never touches do not count (``torch.zeros`` of a fresh mapping: the KV cache's, whose figure is
therefore its buffers' size, not a peak). CPU only: a GPU's allocator statistics are the GPU
check's (``python -m experiments.gpu_check``). The full-depth plan is the per-layer figures times the real depth: the
weights of ``K`` layers grow linearly in ``K`` (``--layers 1 2`` measures the slope), the cache too.

    python -m experiments.bench_memory --models janus_pro_1b janus_pro_7b --layers 1 2 --batch-sizes 1 4 \\
        --json results/bench/memory_plan_cpu.jsonl
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import ctypes
import gc
import json
import multiprocessing
import platform
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from csd.compose import build_adapter, build_drafter, build_rule
from csd.engine import JacobiEngine
from csd.plan import activation_bytes, config_plan, module_bytes
from csd.presets import CONF_DIR
from csd.ragged import SlotBatch
from csd.slot import Request

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
CAPTIONS = ("A man riding a wave on top of a surfboard.", "Two dogs playing with a red frisbee in a park.",
            "A kitchen with a white refrigerator and wooden cabinets.", "A red double decker bus on a city street.")
COMPONENTS = ("weights", "kv_cache", "mask_table", "prefill", "iteration", "first_prefill", "first_iteration")


class Measured(Exception):
    """Raised by the measured engine once its iterations are measured: the images need not finish."""


def status_bytes(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in bytes."""
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) * 1024


def return_freed_memory() -> None:
    """glibc: map blocks of 64 KiB or more and trim the heap on every free, so resident memory follows live memory."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    libc.mallopt(M_TRIM_THRESHOLD, 0)


@contextmanager
def peak(out: list[int]) -> Iterator[None]:
    """Append the resident high-water mark above the block's start to ``out``."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = status_bytes("VmRSS")
    yield
    out.append(status_bytes("VmHWM") - start)


def rehearsal_cfg(model: str, layers: int, batch: int, method: str, window: int) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", "model.random_init=true", f"model.layers={layers}",
                                           f"method={method}", f"drafter.window={window}", f"engine.batch_size={batch}",
                                           "device=cpu"])
    with open_dict(cfg):
        cfg.engine.memory_gb = 1024  # the plan's figures, not this machine's budget
    return cfg


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def measure(model: str, layers: int, batch: int, method: str, window: int, iterations: int) -> dict[str, Any]:
    """One (model, K, B): the planned and measured bytes of every component (:data:`COMPONENTS`)."""
    cfg = rehearsal_cfg(model, layers, batch, method, window)
    plan = config_plan(cfg)[0]
    adapter = build_adapter(cfg.model, torch.device("cpu"))
    engine = JacobiEngine(adapter, build_rule(cfg.method), build_drafter(cfg.drafter), batch_size=batch)
    return_freed_memory()  # after the engine's own heap setting (csd.device.keep_temporaries_on_heap)
    prefills: list[int] = []
    steps: list[int] = []
    keys: list[int] = []
    state = SlotBatch(adapter, 1)
    for caption in CAPTIONS[:3]:  # a slot's prefill, three times: the first also makes the process's one-time allocations
        before = storage_bytes(state.cache.keys + state.cache.values)
        with peak(prefills):
            state.prefill(0, caption)
        prefills[-1] -= storage_bytes(state.cache.keys + state.cache.values) - before  # the cache it grew: kv_cache
    del state
    iteration = engine._iteration

    def measured_iteration(state: SlotBatch, slots: list) -> list[int]:
        if len(steps) == iterations:
            raise Measured
        keys.append(max(state.cache.filled) + window)
        with peak(steps):
            return iteration(state, slots)

    engine._iteration = measured_iteration
    try:
        list(engine.generate_many([Request(CAPTIONS[i % len(CAPTIONS)], i) for i in range(batch)]))
    except Measured:
        pass
    cache = engine._batch.cache
    kv, mask = storage_bytes(cache.keys + cache.values), 0 if cache._causal is None else storage_bytes([cache._causal])
    shape = plan.shape
    prompt_len = max(len(row) for caption in CAPTIONS[:3] for row in adapter.prompt_inputs(caption))
    planned_step = max(batch * activation_bytes(shape, window, k) for k in keys)
    out = {
        "model": model, "layers": layers, "batch": batch, "method": method, "window": window, "dtype": cfg.model.dtype,
        "planned": {"weights": shape.weight_bytes, "kv_cache": batch * plan.kv_per_slot, "mask_table": plan.mask_table,
                    "prefill": activation_bytes(shape, prompt_len, prompt_len), "iteration": planned_step,
                    "first_prefill": activation_bytes(shape, prompt_len, prompt_len), "first_iteration": planned_step},
        "measured": {"weights": module_bytes(adapter.model), "kv_cache": kv, "mask_table": mask,
                     "prefill": max(prefills[1:]), "iteration": max(steps[1:]), "first_prefill": prefills[0],
                     "first_iteration": steps[0]},
        "cache_len": plan.cache_len, "iteration_keys": keys, "iteration_peaks": steps, "prefill_peaks": prefills,
        "host": platform.node(), "torch": torch.__version__,
    }
    del engine, adapter
    gc.collect()
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: planned / measured MB and their ratio per component."""
    lines = ["| model | K | B | " + " | ".join(f"{c} MB (plan / measured)" for c in COMPONENTS) + " |",
             "|---|---|---|" + "---|" * len(COMPONENTS)]
    for r in rows:
        cells = []
        for c in COMPONENTS:
            p, m = r["planned"][c], r["measured"][c]
            cells.append(f"{p / 2**20:.1f} / {m / 2**20:.1f} ({p / m:.2f})" if m else f"{p / 2**20:.1f} / 0")
        lines.append(f"| {r['model']} | {r['layers']} | {r['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure_fresh(*args: Any) -> dict[str, Any]:
    """:func:`measure` in a new interpreter (its resident memory is that run's alone)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, args)


def main(argv: list[str] | None = None, run: Callable[..., dict[str, Any]] = measure_fresh) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["janus_pro_1b"])
    parser.add_argument("--layers", nargs="+", type=int, default=[1])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--method", default="sjd")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=4, help="measured iterations per run (the largest peak)")
    parser.add_argument("--json", type=Path, help="append one line per run")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models:
        for layers in args.layers:
            for batch in args.batch_sizes:
                row = run(model, layers, batch, args.method, args.window, args.iterations)
                rows.append(row)
                if args.json:
                    with args.json.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
