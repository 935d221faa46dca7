"""Latency benchmark of the decoding paths (docs/PERFORMANCE.md): eager and compiled, both on the one ragged cache.

Measures, for one Janus-Pro model config:

* per-step time of a ``q = 1`` and a ``q = L`` forward on each path, with a full image's worth of
  cache (prompt + image body), and the compile time of the two shapes;
* the memory-bandwidth floor per step: bytes of the weights a step reads / a measured device copy rate;
* the full-image AR latency (the engine with ``window = 1``) on each path;
* SJD and CSD per-iteration time on the fastest path (the engine with ``window = L``, drafts padded);
* CSD's overhead over SJD per iteration: ``verify_window`` with each rule on the same ``[L, V]``
  tensors (entropy, TV filter, relaxed acceptance), device-synchronised over many repetitions.

Weights: random weights of the real shape change no per-step cost (only how many steps speculative
decoding needs, so SJD/CSD step compression is meaningful with ``--weights`` only). Without
``--weights`` the model is built from the config's ``config.json`` when it is available offline,
else from the Janus-Pro-7B / 1B shapes of ``csd.adapters.shapes.REAL_SHAPES``. Prompts are then synthetic ids of ``--prompt-len``.

GPU (one H200, 7B shape, ~5 min of which ~130 s compile)::

    HF_HUB_OFFLINE=1 python -m experiments.bench_latency --model janus_pro_7b

CPU smoke run (seconds): ``python -m experiments.bench_latency --model janus_pro_tiny --compile-backend aot_eager``.
Writes ``<out>/<model>_<device>.json`` and ``.md`` (default ``runs/bench/``, untracked: the committed
``results/bench/`` files change only with an explicit ``--out results/bench``).
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import OmegaConf
from torch._dynamo.utils import counters
from transformers import JanusConfig, JanusForConditionalGeneration

from csd.acceptance import CSD, SJD, AcceptanceRule, entropy
from csd.adapters.base import SamplingConfig, default_dtype
from csd.adapters.janus import JanusAdapter, load_janus_adapter, tiny_janus_adapter
from csd.adapters.shapes import real_janus_config
from csd.device import resolve_device, synchronize
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.fast import CompiledStep
from csd.hub import load_local_first
from csd.presets import CONF_DIR
from csd.ragged import SlotBatch
from csd.verify import verify_window

#: where results go without ``--out``: untracked, so a benchmark never overwrites the committed ``results/bench/``
DEFAULT_OUT = Path("runs/bench")

#: the Janus-Pro configs with a real shape for offline runs without any model file (csd.adapters.shapes.REAL_SHAPES)
JANUS_PRO_SHAPES = ("janus_pro_7b", "janus_pro_1b")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: synthetic prompt ids: BOS, pad and BOI, then caption bytes from SYNTH_BYTE0
SYNTH_BOS, SYNTH_PAD, SYNTH_BOI, SYNTH_BYTE0 = 1, 0, 2, 3
CAPTION = "a photo of a red fox sitting in the snow next to a wooden cabin, golden hour light, "


# ------------------------------------------------------------------------------------------- models


def synthetic_encoder(vocab: int) -> Callable[[str], torch.Tensor]:
    """BOS + caption bytes + BOI as ids of a random-weight model (the length is all that matters)."""

    def encode(caption: str) -> torch.Tensor:
        return torch.tensor([SYNTH_BOS, *((SYNTH_BYTE0 + b) % vocab for b in caption.encode()), SYNTH_BOI])

    return encode


def random_janus(
    name: str, path: str, dtype: torch.dtype, device: torch.device
) -> tuple[JanusForConditionalGeneration, str]:
    """Random weights of the real shape: from ``path``'s config.json when available, else csd.adapters.shapes.REAL_SHAPES."""
    try:
        config = load_local_first(lambda: JanusConfig.from_pretrained(path))
        source = f"config.json of {path}"
    except (OSError, ValueError):  # hub clients raise OSError / HFValidationError subclasses
        if name not in JANUS_PRO_SHAPES:
            raise
        config, source = real_janus_config(name), "csd.adapters.shapes.REAL_SHAPES"
    with default_dtype(dtype), device:
        model = JanusForConditionalGeneration(config)
    return model, f"random weights ({source})"


def base_adapter(args: argparse.Namespace, device: torch.device) -> tuple[JanusAdapter, str, str]:
    """The eager adapter of ``args.model``, how its weights were made, and the prompt to decode."""
    params = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml"), resolve=True)
    target = params.pop("_target_")
    params.pop("name")
    params["top_k"] = params.get("top_k") or 0
    if args.dtype:
        params["dtype"] = args.dtype
    if target.endswith("tiny_janus_adapter"):
        return tiny_janus_adapter(**params, device=str(device)), "tiny random model", CAPTION
    if not target.endswith("load_janus_adapter"):
        raise SystemExit(f"bench_latency supports the Janus-Pro model configs, not {args.model} ({target})")
    path = args.path or params["path"]
    if args.weights:
        params.update(path=path, random_init=False, device=str(device))
        return load_janus_adapter(**params), f"weights of {path}", CAPTION
    model, source = random_janus(args.model, path, DTYPES[params["dtype"]], device)
    vocab = model.config.text_config.vocab_size
    sampling = SamplingConfig(params["guidance_scale"], params["top_k"], params["temperature"])
    adapter = JanusAdapter(model, synthetic_encoder(vocab), (SYNTH_BOS, SYNTH_PAD, SYNTH_BOI), sampling)
    caption = (CAPTION * (args.prompt_len // len(CAPTION) + 1))[: args.prompt_len - 2]
    return adapter, source, caption


def step_weight_bytes(model: JanusForConditionalGeneration) -> int:
    """Bytes of the weights every decode step reads: the language model (without its input embedding
    table, of which a step reads a few rows) and the image head."""
    modules = [model.model.language_model, model.model.generation_head, model.model.generation_aligner]
    skip = {id(model.model.language_model.get_input_embeddings().weight)}
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters() if id(p) not in skip)


# ------------------------------------------------------------------------------------------- timing


def copy_rate(device: torch.device, n_bytes: int, reps: int = 10) -> float:
    """Measured device memory bandwidth in bytes/s: a ``copy_`` of ``n_bytes`` reads and writes them."""
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    synchronize(device)
    return 2 * n_bytes * reps / (time.perf_counter() - start)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes, device-synchronised."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def summary_ms(seconds: list[float]) -> dict[str, float]:
    return {"median_ms": 1e3 * statistics.median(seconds), "mean_ms": 1e3 * statistics.fmean(seconds)}


@torch.no_grad()
class WindowForward:
    """``forward(q)``: one forward of the first ``q`` of fixed random body ids on a one-slot ``batch``."""

    def __init__(self, batch: SlotBatch, ids: torch.Tensor) -> None:
        self.batch, self.ids = batch, ids

    def __call__(self, q: int, from_prompt: bool = False) -> torch.Tensor:
        return self.batch.forward(self.ids[:q].unsqueeze(0), [from_prompt], [True])


def full_image_batch(adapter: JanusAdapter, compiled: CompiledStep | None, prompt: str, window: int
                     ) -> tuple[WindowForward, int, float, float]:
    """A one-slot batch (``csd.ragged.SlotBatch``) holding the prompt and a full image of body entries, filled with
    ``window``-row forwards (the compiled path's shapes); its forward, the cached body entries, and the seconds of the
    first ``q = window`` and ``q = 1`` calls (their compilation on the compiled path)."""
    device = adapter.device
    gen = torch.Generator(device=device).manual_seed(0)
    ids = adapter.image_token_ids.to(device)[
        torch.randint(adapter.vocab_size, (window,), generator=gen, device=device)
    ]
    batch = SlotBatch(adapter, 1, compiled)
    batch.prefill(0, prompt)
    forward = WindowForward(batch, ids)
    first_l = timed(lambda: forward(window, from_prompt=True), device)
    first_1 = timed(lambda: forward(1), device)
    filled = window + 1
    while filled + window <= adapter.layout.length:
        forward(window)
        filled += window
    return forward, filled, first_l, first_1


def step_times(adapter: JanusAdapter, compiled: CompiledStep | None, prompt: str, window: int, warmup: int,
               steps: int) -> dict[str, Any]:
    """Per-step time of ``q = 1`` and ``q = window`` forwards after a full image of cache entries, on the engine's
    cache (``csd.ragged.SlotBatch`` of one slot).

    The cache is filled with ``window``-row forwards only (the compiled path's two shapes); each timed
    forward is rolled back, so every step sees the same cache length. The first call of each shape
    (its compilation on the compiled path) is reported as ``first_call_s``.
    """
    forward, filled, first_l, first_1 = full_image_batch(adapter, compiled, prompt, window)
    device = adapter.device
    out: dict[str, Any] = {"cached_body_tokens": filled}
    for q, first in ((1, first_1), (window, first_l)):
        times = []
        for i in range(warmup + steps):
            dt = timed(lambda q=q: (forward(q), forward.batch.rollback([q])), device)
            if i >= warmup:
                times.append(dt)
        out[f"q{q}"] = {**summary_ms(times), "first_call_s": first}
    return out


def step_kernels(adapter: JanusAdapter, compiled: CompiledStep | None, prompt: str, window: int, steps: int,
                 top: int = 15) -> dict[str, Any]:
    """Where a ``q = 1`` step's time goes: ``steps`` forwards after a full image of cache entries (as
    :func:`step_times`, each rolled back) under ``torch.profiler``; the ``top`` kernels (CUDA) or operators (CPU) by
    self time, per step, and their sum next to the wall time per step: a sum well under the wall time means the step
    waits on the host (launches, guards), a sum near it that the kernels themselves are slow."""
    from torch.profiler import ProfilerActivity, profile

    device = adapter.device
    cuda = device.type == "cuda"
    forward, filled, _, _ = full_image_batch(adapter, compiled, prompt, window)
    for _ in range(3):  # warm (and, compiled, captured)
        forward(1)
        forward.batch.rollback([1])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            forward(1)
            forward.batch.rollback([1])
        synchronize(device)
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0]
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events.sort(key=own, reverse=True)
    total_us = sum(own(e) for e in events)
    return {
        "kind": "CUDA kernels" if cuda else "CPU operators", "cached_body_tokens": filled, "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps, "self_ms_per_step": total_us / 1e3 / steps,
        "top": [{"name": e.key[:120], "calls_per_step": e.count / steps, "ms_per_step": own(e) / 1e3 / steps,
                 "share": own(e) / total_us} for e in events[:top]],
    }


def engine_times(adapter: JanusAdapter, compiled: CompiledStep | None, rule: AcceptanceRule, window: int, prompt: str,
                 images: int, warmup: int) -> dict[str, Any]:
    """Full-image decoding with the engine: latency, iterations (NFE) and time per iteration, after ``warmup`` untimed
    images; ``graphs_compiled_while_timed`` counts the graphs dynamo compiled during the timed ones (0 when the
    warm-up compiled every shape the rule and window need; otherwise the latency holds compilation)."""
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=window), compiled=compiled)
    for seed in range(warmup):
        engine.generate(prompt, seed=10_000 + seed)
    graphs = counters["stats"]["unique_graphs"]
    gens = [engine.generate(prompt, seed=seed) for seed in range(images)]
    iteration_s = [g.decode_s / g.nfe for g in gens]
    return {
        "graphs_compiled_while_timed": counters["stats"]["unique_graphs"] - graphs,
        "latency_s": statistics.fmean(g.prefill_s + g.decode_s for g in gens),
        "prefill_s": statistics.fmean(g.prefill_s for g in gens),
        "nfe": statistics.fmean(g.nfe for g in gens),
        "step_compression": statistics.fmean(g.step_compression for g in gens),
        "ms_per_iteration": 1e3 * statistics.fmean(iteration_s),
    }


@torch.no_grad()
def verify_times(
    vocab: int, window: int, device: torch.device, reps: int, rules: dict[str, AcceptanceRule]
) -> dict[str, float]:
    """ms per call of ``verify_window`` per rule (and of the entropy the engine computes for every rule)
    on the same ``[1, L, V]`` target and draft distributions; rules are timed interleaved, in blocks."""
    gen = torch.Generator(device=device).manual_seed(0)
    logits = 3 * torch.randn((1, window, vocab), generator=gen, device=device)
    target = torch.softmax(logits, -1)
    # carried drafts: distributions near the target (so the TV filter sees both outcomes)
    draft_probs = torch.softmax(
        logits[:, 1:] + torch.randn(logits[:, 1:].shape, generator=gen, device=device), -1
    )
    drafts = torch.randint(vocab, (1, window - 1), generator=gen, device=device)
    forced = torch.zeros((1, window - 1), dtype=torch.bool, device=device)
    target_ent = entropy(target)
    calls: dict[str, Callable[[], Any]] = {
        name: (lambda r=rule: verify_window(r, target, target_ent, drafts, draft_probs, forced, gen))
        for name, rule in rules.items()
    }
    calls["entropy"] = lambda: entropy(target)
    totals = dict.fromkeys(calls, 0.0)
    block = max(reps // 10, 1)
    for fn in calls.values():  # warm-up
        for _ in range(block):
            fn()
    for _ in range(reps // block):
        for name, fn in calls.items():
            totals[name] += timed(lambda fn=fn: [fn() for _ in range(block)], device)
    return {name: 1e3 * total / (block * (reps // block)) for name, total in totals.items()}


# ------------------------------------------------------------------------------------------- report


def markdown(res: dict[str, Any]) -> str:
    meta, window = res["meta"], res["meta"]["window"]
    lines = [
        f"## Latency: {meta['model']} ({meta['weights']}), {meta['dtype']}, {meta['device_name']}",
        "",
        f"torch {meta['torch']}, transformers {meta['transformers']}; CFG rows {meta['rows']}, prompt "
        f"{meta['prompt_tokens']} tokens, window L = {window}, steps timed after {meta['steps']['cached']} cached "
        f"body tokens ({meta['steps']['warmup']} warm-up + {meta['steps']['timed']} timed, median).",
        "",
        f"Bandwidth floor per step: {res['bandwidth']['weight_gb']:.2f} GB of weights / "
        f"{res['bandwidth']['copy_tb_s']:.2f} TB/s copy rate = **{res['bandwidth']['floor_ms']:.2f} ms**",
        "",
        f"| path | q = 1 (ms) | q = {window} (ms) | first call q = 1 / {window} (s) | AR image (s) | AR ms/step |",
        "|---|---|---|---|---|---|",
    ]
    for path, r in res["paths"].items():
        s, ar = r["steps"], r.get("ar")
        image = f"{ar['latency_s']:.2f} | {ar['ms_per_iteration']:.2f}" if ar else "- | -"
        lines.append(
            f"| {path} | {s['q1']['median_ms']:.2f} | {s[f'q{window}']['median_ms']:.2f} | "
            f"{s['q1']['first_call_s']:.1f} / {s[f'q{window}']['first_call_s']:.1f} | {image} |"
        )
    spec = res["speculative"]
    lines += [
        "",
        f"Speculative decoding on the {spec['path']} path (L = {window}, drafts padded to L):",
        "",
        "| method | ms / iteration | of which outside the forward | iterations | step compression | image latency (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("sjd", "csd"):
        r = spec[name]
        lines.append(
            f"| {name} | {r['ms_per_iteration']:.2f} | {r['outside_forward_ms']:.2f} | {r['nfe']:.0f} | "
            f"{r['step_compression']:.2f} | {r['latency_s']:.2f} |"
        )
    v = res["verify"]
    lines += [
        "",
        f"`verify_window` on [{window}, {meta['vocab']}] ({v['reps']} reps): SJD {v['sjd_ms']:.3f} ms, "
        f"CSD {v['csd_ms']:.3f} ms, entropy {v['entropy_ms']:.3f} ms. **CSD overhead over SJD: "
        f"{v['csd_overhead_ms']:.3f} ms / iteration** ({v['csd_overhead_with_entropy_ms']:.3f} ms counting the "
        f"entropy an SJD-only engine could skip).",
    ]
    if meta["compile_backend"]:
        c = res["compile"]
        lines += [
            "",
            f"Compiled graphs: {c['graphs']} (expected 2), CUDA-graph skips: {c['cudagraph_skips']} (expected 0 on CUDA).",
        ]
    if not meta["weights"].startswith("weights"):
        lines += ["", "Random weights: per-step costs are real, step compression is not."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.bench_latency",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="janus_pro_7b", help="a conf/model/ name (Janus-Pro family)")
    p.add_argument("--weights", action="store_true", help="load the checkpoint (default: random weights)")
    p.add_argument("--path", help="hub id or directory overriding the config's model.path")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="override the config's dtype")
    p.add_argument("--device", default="auto")
    p.add_argument("--window", type=int, default=16, help="L: rows of a speculative forward")
    p.add_argument("--prompt-len", type=int, default=64, help="synthetic prompt tokens (random weights)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--images", type=int, default=1, help="timed full images per engine measurement")
    p.add_argument("--verify-reps", type=int, default=200)
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled path")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled path")
    p.add_argument(
        "--eager-images",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="full AR images on the eager path too (7B on an H200: ~65 s)",
    )
    p.add_argument("--lam", type=float, default=0.1)
    p.add_argument("--delta", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"results directory (default {DEFAULT_OUT}; the committed ones: results/bench)")
    args = p.parse_args(argv)
    if args.window < 2:
        p.error("--window must be >= 2")
    return args


def build_paths(base: JanusAdapter, args: argparse.Namespace, max_cache_len: int) -> dict[str, CompiledStep | None]:
    """The decoding paths: eager (None) and compiled (one cache length for every use)."""
    paths: dict[str, CompiledStep | None] = {"eager": None}
    if not args.no_compile:
        paths["compiled"] = CompiledStep(base, max_cache_len, args.compile_backend)
    return paths


def describe_run(args: argparse.Namespace, base: JanusAdapter, weights: str, prompt: str) -> dict[str, Any]:
    device, rows = base.device, base.prompt_rows(prompt)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "model": args.model,
        "weights": weights,
        "dtype": str(next(base.model.parameters()).dtype).removeprefix("torch."),
        "device": device.type,
        "device_name": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "window": args.window,
        "rows": int(rows.shape[0]),
        "prompt_tokens": int(rows.shape[1]),
        "vocab": base.vocab_size,
        "body_length": base.layout.length,
        "compile_backend": None if args.no_compile else args.compile_backend,
        "steps": {"warmup": args.warmup, "timed": args.steps},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    start = time.perf_counter()

    def stage(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {text}", flush=True)

    base, weights, prompt = base_adapter(args, device)
    res: dict[str, Any] = {"meta": describe_run(args, base, weights, prompt)}
    # one cache length for every use, so that the compiled path captures exactly two graphs
    max_cache_len = -(-(res["meta"]["prompt_tokens"] + base.layout.length + args.window) // 64) * 64
    res["meta"]["max_cache_len"] = max_cache_len
    paths = build_paths(base, args, max_cache_len)

    rate = copy_rate(device, (1 << 30) if device.type == "cuda" else (64 << 20))
    weight_bytes = step_weight_bytes(base.model)
    res["bandwidth"] = {
        "weight_gb": weight_bytes / 1e9,
        "copy_tb_s": rate / 1e12,
        "floor_ms": 1e3 * weight_bytes / rate,
    }
    res["paths"] = {}
    for name, compiled in paths.items():
        stage(f"steps: {name}")
        res["paths"][name] = {"steps": step_times(base, compiled, prompt, args.window, args.warmup, args.steps)}
    res["meta"]["steps"]["cached"] = res["paths"]["eager"]["steps"]["cached_body_tokens"]

    fastest = "eager" if args.no_compile else "compiled"
    for name, compiled in paths.items():
        if name == fastest or args.eager_images:
            stage(f"AR image: {name}")
            warmup = 1 if name == "compiled" else 0
            res["paths"][name]["ar"] = engine_times(base, compiled, SJD(), 1, prompt, args.images, warmup)

    rules = {"sjd": SJD(), "csd": CSD(lam=args.lam, delta=args.delta)}
    step_ms = res["paths"][fastest]["steps"][f"q{args.window}"]["median_ms"]
    res["speculative"] = {"path": fastest}
    for name, rule in rules.items():
        stage(f"{name}: {fastest}")
        r = engine_times(base, paths[fastest], rule, args.window, prompt, args.images, 1)
        res["speculative"][name] = {**r, "outside_forward_ms": r["ms_per_iteration"] - step_ms}

    stage("verify_window")
    ver = verify_times(base.vocab_size, args.window, device, args.verify_reps, rules)
    overhead = ver["csd"] - ver["sjd"]
    res["verify"] = {
        "reps": args.verify_reps,
        "sjd_ms": ver["sjd"],
        "csd_ms": ver["csd"],
        "entropy_ms": ver["entropy"],
        "csd_overhead_ms": overhead,
        "csd_overhead_with_entropy_ms": overhead + ver["entropy"],
    }
    # dynamo's internal counters: the compiled path should trace 2 graphs and replay them as CUDA graphs
    stats = torch._dynamo.utils.counters
    res["compile"] = {
        "graphs": stats["stats"]["unique_graphs"],
        "cudagraph_skips": stats["inductor"]["cudagraph_skips"],
    }
    res["meta"]["wall_s"] = time.perf_counter() - start

    write_results(res, args.out / f"{args.model}_{device.type}", markdown(res))
    return res


def write_results(res: dict[str, Any], stem: Path, table: str, echo: bool = True) -> None:
    """``<stem>.json`` (everything measured) and ``<stem>.md`` (the table), printed too unless not ``echo``."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(res, indent=2))
    stem.with_suffix(".md").write_text(table)
    if echo:
        print(table)
        print(f"wrote {stem}.json and {stem}.md in {res['meta']['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
