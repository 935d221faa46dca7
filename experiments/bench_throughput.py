"""Throughput benchmark of batched decoding: images/s and per-image NFE per (method, batch size B).

For every method (AR, SJD, CSD) and B, ``JacobiEngine(batch_size=B).generate_many`` decodes
``max(--images, --rounds * B)`` images (continuous refill: a finished row takes the next image) after
``--warmup`` untimed ones; images/s = images / wall time of the pass, which includes the drain at the end
(the last images finish with fewer and fewer busy slots); steady images/s counts only the span in which every slot
is busy (first completion until a freed slot finds no next image), the rate of a long run. An image depends only on
(prompt, seed), so every image also decoded at B = 1 must have the same tokens and NFE there
(``mismatches``: images that differ; 0 in fp32, other GPU kernels for other batch shapes may change
low-precision numerics).

Models: ``toy`` (the embedded trained model: real acceptance, so real NFE), ``janus_pro_tiny``, and
``janus_pro_1b`` / ``janus_pro_7b`` with random weights of the real shape (experiments/bench_latency.py:
per-step costs are real, step compression is not). Prompts: the toy held-out captions (image ``i``:
caption ``i`` mod their number, seed ``i``).

CPU (the table in docs/PERFORMANCE.md, ~10 min on 2 cores)::

    python -m experiments.bench_throughput --model toy --batch-sizes 1,16 --images 32

GPU (one call): ``python -m experiments.bench_throughput --model janus_pro_1b --images 4 --rounds 2``.
Writes ``<out>/throughput_<model>_<device>.json`` and ``.md`` (default ``runs/bench/``, untracked: the committed
``results/bench/`` files change only with an explicit ``--out results/bench``).
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from csd.acceptance import CSD, SJD, AcceptanceRule
from csd.adapters.base import ModelAdapter, SamplingConfig
from csd.adapters.janus import JanusAdapter
from csd.compose import build_adapter
from csd.device import resolve_device, synchronize
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.fast import CompiledStep
from csd.presets import CONF_DIR
from csd.slot import Request
from csd.toy.domain import toy_prompts
from experiments.bench_latency import (
    CAPTION,
    DEFAULT_OUT,
    DTYPES,
    JANUS_PRO_SHAPES,
    SYNTH_BOI,
    SYNTH_BOS,
    SYNTH_PAD,
    random_janus,
    synthetic_encoder,
    write_results,
)

MODELS = ("toy", "janus_pro_tiny", *JANUS_PRO_SHAPES)


def build_model(model_cfg: DictConfig, device: torch.device) -> tuple[ModelAdapter, str]:
    """The adapter of a ``conf/model/`` config (Janus-Pro 1B/7B: random weights of the real shape) and its weights."""
    name = model_cfg.name
    if name not in JANUS_PRO_SHAPES:
        return build_adapter(model_cfg, device), "trained" if name == "toy" else "tiny random model"
    model, source = random_janus(name, model_cfg.path, DTYPES[model_cfg.dtype], device)
    sampling = SamplingConfig(model_cfg.guidance_scale, model_cfg.top_k or 0, model_cfg.temperature)
    encode = synthetic_encoder(model.config.text_config.vocab_size)
    return JanusAdapter(model, encode, (SYNTH_BOS, SYNTH_PAD, SYNTH_BOI), sampling), source


def make_requests(captions: list[str], n: int, seed0: int = 0) -> list[Request]:
    return [Request(captions[i % len(captions)], seed0 + i, key=i) for i in range(n)]


def decode_pass(engine: JacobiEngine, requests: list[Request], device: torch.device) -> tuple[dict[int, Any], float, float | None]:
    """key -> (tokens, nfe) of every request, the wall time of the pass (device-synchronised), and the steady-state
    images/s: completions per second from the first completion until the queue runs dry (a freed slot finds no
    next image; until then every slot is busy, as in a long run), None when no image completes in that span."""
    pulled: list[float] = []

    def feed():
        yield from requests
        pulled.append(time.perf_counter())  # the engine asked for an image after the last one

    synchronize(device)
    start = time.perf_counter()
    out, done = {}, []
    for request, gen in engine.generate_many(feed()):
        out[request.key] = (gen.tokens.tolist(), gen.nfe)
        done.append(time.perf_counter())
    synchronize(device)
    seconds = time.perf_counter() - start
    steady = [t for t in done[1:] if t <= pulled[0]]
    return out, seconds, (len(steady) / (pulled[0] - done[0]) if steady else None)


def bench_method(
    adapter: ModelAdapter, rule: AcceptanceRule, window: int, captions: list[str], args: argparse.Namespace, stage,
    compiled: CompiledStep | None = None,
) -> dict[int, dict[str, Any]]:
    """Per batch size: images, images/s, mean NFE and step compression of the images also decoded at B = 1
    (``nfe_mean_all``: of every image), and how many of those differ from B = 1 (tokens or NFE). ``compiled``: decode
    on the compiled step (experiments/gpu_check.py; two graphs per batch size)."""
    out: dict[int, dict[str, Any]] = {}
    reference: dict[int, Any] = {}
    for batch in args.batch_sizes:
        engine = JacobiEngine(adapter, rule, ChainDrafter(window=window), batch_size=batch, compiled=compiled)
        decode_pass(engine, make_requests(captions, args.warmup, seed0=10_000), adapter.device)
        n = max(args.images, args.rounds * batch)
        results, seconds, steady = decode_pass(engine, make_requests(captions, n), adapter.device)
        if not reference:
            reference = results
        common = sorted(reference.keys() & results.keys())  # the first --images images: per-image numbers compare
        out[batch] = {
            "images": n,
            "seconds": seconds,
            "images_per_s": n / seconds,
            "steady_images_per_s": steady,
            "nfe_mean": statistics.fmean(results[k][1] for k in common),
            "step_compression": statistics.fmean(len(results[k][0]) / results[k][1] for k in common),
            "nfe_mean_all": statistics.fmean(nfe for _, nfe in results.values()),
            "compared": len(common),
            "mismatches": sum(results[k] != reference[k] for k in common),
        }
        stage(f"B={batch}: {n} images in {seconds:.1f} s, {n / seconds:.2f} images/s")
    return out


def markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    lines = [
        f"## Throughput: {meta['model']} ({meta['weights']}), {meta['dtype']}, {meta['device_name']}, "
        f"{meta['threads']} thread(s)",
        "",
        f"torch {meta['torch']}, transformers {meta['transformers']}; window L = {meta['window']} (AR: 1); "
        f"{meta['warmup']} warm-up image(s) per measurement; images = max({meta['images']}, {meta['rounds']} x B); "
        f"NFE and step compression over the first {meta['images']} images (those decoded at every B).",
        "",
        "| method | B | images | images/s | vs B = 1 | steady images/s | vs B = 1 | NFE / image | step compression "
        "| mismatches vs B = 1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, by_batch in res["methods"].items():
        first = next(iter(by_batch.values()))
        base, steady_base = first["images_per_s"], first["steady_images_per_s"]
        for batch, r in by_batch.items():
            steady = r["steady_images_per_s"]
            steady_cols = "n/a | n/a" if steady is None or steady_base is None else f"{steady:.2f} | {steady / steady_base:.2f}x"
            lines.append(
                f"| {method} | {batch} | {r['images']} | {r['images_per_s']:.2f} | {r['images_per_s'] / base:.2f}x | "
                f"{steady_cols} | "
                f"{r['nfe_mean']:.1f} | {r['step_compression']:.2f} | {r['mismatches']} / {r['compared']} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.bench_throughput",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="toy", choices=MODELS)
    p.add_argument("--methods", default="ar,sjd,csd", help="comma-separated: ar, sjd, csd")
    p.add_argument("--batch-sizes", default="1,4,16,64", help="comma-separated B values; the first is the reference")
    p.add_argument("--images", type=int, default=32, help="images per measurement (at least --rounds x B)")
    p.add_argument("--rounds", type=int, default=2, help="images per measurement >= rounds x B (refill and tail)")
    p.add_argument("--warmup", type=int, default=1, help="untimed images before each measurement")
    p.add_argument("--window", type=int, default=16, help="L of SJD and CSD")
    p.add_argument("--lam", type=float, default=0.1)
    p.add_argument("--delta", type=float, default=0.5)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"results directory (default {DEFAULT_OUT}; the committed ones: results/bench)")
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    unknown = sorted(set(args.methods) - {"ar", "sjd", "csd"})
    if unknown:
        p.error(f"--methods: unknown {unknown}; choose from ar, sjd, csd")
    if min(args.batch_sizes) < 1 or min(args.images, args.rounds, args.window) < 1 or args.warmup < 0:
        p.error("--batch-sizes, --images, --rounds and --window must be >= 1, --warmup >= 0")
    return args


@torch.no_grad()
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    start = time.perf_counter()

    def stage(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {text}", flush=True)

    model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml")
    adapter, weights = build_model(model_cfg, device)
    captions = [p.text for p in toy_prompts(256)]
    if args.model in JANUS_PRO_SHAPES:
        captions = [f"{c}, {CAPTION}" for c in captions]
    rules = {"ar": (SJD(), 1), "sjd": (SJD(), args.window), "csd": (CSD(lam=args.lam, delta=args.delta), args.window)}
    res: dict[str, Any] = {
        "meta": {
            "model": args.model, "weights": weights, "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "dtype": model_cfg.dtype,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
            "window": args.window, "images": args.images, "rounds": args.rounds, "warmup": args.warmup,
            "batch_sizes": args.batch_sizes, "lam": args.lam, "delta": args.delta,
        },
        "methods": {},
    }
    for method in args.methods:
        stage(method)
        rule, window = rules[method]
        res["methods"][method] = bench_method(adapter, rule, window, captions, args, stage)
    res["meta"]["wall_s"] = time.perf_counter() - start

    write_results(res, args.out / f"throughput_{args.model}_{device.type}", markdown(res))
    return res


if __name__ == "__main__":
    main()
