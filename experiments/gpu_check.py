"""One GPU check (docs/PERFORMANCE.md, "On a GPU"): everything a session with a lent GPU must measure, in one call.

A Janus-Pro-7B-shaped model with random bf16 weights (the shape of ``csd.adapters.shapes.REAL_SHAPES``, nothing downloaded)
on the compiled path (inductor, CUDA graphs) and the eager one:

* ``floor``: the memory-bandwidth floor per step, step weights / 4.8 TB/s (the H200's HBM3e bandwidth, NVIDIA's
  H200 datasheet), and the same with the measured copy rate;
* ``steps``: per-step time of ``q = 1`` and ``q = L`` forwards, eager and compiled (``bench_latency.step_times``);
* ``agreement``: compiled vs eager tokens of the same AR and SJD images (share of equal positions, NFE);
* ``images``: AR, SJD and CSD image latency and ms per iteration on the compiled path (``bench_latency.engine_times``,
  after one untimed image per rule), and the share of an iteration outside the bare compiled decode step of ``steps``
  (``q = 1`` for AR, ``q = L`` else; the engine's target step counts as outside);
* ``throughput``: SJD images/s at B = 1 / 4 / 16 on the compiled path (``bench_throughput.bench_method``);
* ``memory``: the peak of ``torch.cuda.max_memory_allocated`` during the throughput part vs the memory plan
  (``csd.plan``) at the largest B;
* ``kernels``: the compiled ``q = 1`` step under ``torch.profiler``: its top kernels and their summed device time per
  step next to the wall time per step (``bench_latency.step_kernels``);
* ``exactness``: the compiled path's tokens against the eager path's in fp32 on the same device, on the tiny Janus
  (batch 1 and B = 3): the token-for-token check the bf16 ``agreement`` cannot be;
* ``overhead``: CSD's cost over SJD per iteration: ``verify_window`` on the same ``[L, V]`` tensors
  (``bench_latency.verify_times``); ``images`` also reports the difference of their ms per iteration;
* ``rules``: every rule class's compiled verification against the eager one on the device, bit for bit, two values of
  every real-valued parameter on one graph (``experiments.rule_exactness``);
* ``host_calls``: the host's CPU time per call of the engine's small calls between two forwards (a trivial compiled
  function, a window's noise draw, the compiled and the eager verification of one full window:
  ``experiments.bench_cold_calls``), warm and after a compiled ``q = L`` step: on a CPU a forward evicts the caches
  and the calls cost several times more after it; on a GPU the forward runs on the device.

Random weights give a near-uniform target, so Jacobi acceptance, NFE and step compression mean nothing here: the SJD
and CSD image latencies are ms per iteration x the iterations random weights happen to need; judge them by ms per
iteration (per-iteration cost), which does not depend on the weights. Each part runs on its own: an error is recorded
in the results (type, message, last traceback lines) and the next part runs; a part started after the budget
(``Setup.budget_s``: 420 s) is skipped and says so. Every part's result and the targets (:data:`TARGETS`), measured value next to target, go to
``<out>/gpu_check_<model>_<device>.json`` and ``.md`` (default ``results/bench``; ``--smoke``: ``runs/bench``).

GPU (one H200, ~8-9 min, of which ~3 min compile; 382 s on 2026-12-04 before the warm-up images, ``exactness`` and
``kernels`` were added; ``host_calls`` adds ~20 s)::

    HF_HUB_OFFLINE=1 python -m experiments.gpu_check

CPU smoke run (the same parts, the tiny Janus in fp32, ``aot_eager``, seconds; tests/engine/test_gpu_check.py)::

    python -m experiments.gpu_check --smoke
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import OmegaConf

from csd.acceptance import CSD, SJD
from csd.device import resolve_device, synchronize
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.fast import CompiledStep
from csd.plan import GB, model_shape, module_bytes, plan_memory
from csd.presets import CONF_DIR
from csd.slot import Request
from experiments import bench_cold_calls, bench_latency, bench_throughput, rule_exactness

#: NVIDIA H200 HBM3e memory bandwidth, bytes/s (NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s)
H200_BANDWIDTH = 4.8e12
#: in the order they run: the cheap ones and the targets' first, throughput (a compilation per batch size) late;
#: rules (a small graph compiled per rule class) and agreement (bf16 tokens of random weights, a diagnosis that
#: ``exactness`` supersedes) are the first parts the time budget skips (rules alone: ``--parts rules``), and the
#: memory, which reads the throughput part, comes last
PARTS = ("floor", "steps", "kernels", "overhead", "images", "exactness", "host_calls", "throughput", "rules",
         "agreement", "memory")
#: parts that only read other parts' results: never skipped past the budget
DERIVED = ("memory",)


@dataclass(frozen=True)
class Setup:
    """What one check runs: the full GPU check or the CPU smoke run."""

    model: str
    dtype: str
    window: int
    backend: str
    warmup: int
    steps: int
    verify_reps: int
    batch_sizes: tuple[int, ...]
    budget_s: float
    host_calls: int


FULL = Setup("janus_pro_7b", "bfloat16", 32, "inductor", 3, 30, 200, (1, 4, 16), 420.0, 100)
SMOKE = Setup("janus_pro_tiny", "float32", 8, "aot_eager", 1, 3, 20, (1, 4, 16), 600.0, 3)


@dataclass
class Check:
    """The model under test and the results so far (part name -> result)."""

    setup: Setup
    device: torch.device
    adapter: Any = None
    prompt: str = ""
    compiled: CompiledStep | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def needs(self, part: str) -> dict[str, Any]:
        """The result of a part this one builds on; an error when that part failed or did not run."""
        result = self.results.get(part, {})
        if not result.get("ok"):
            raise RuntimeError(f"needs the {part} part, which did not succeed")
        return result["result"]


def build_model(check: Check) -> dict[str, Any]:
    """The random-weight model (``bench_latency.base_adapter``) and its compiled step, one cache length for all."""
    s = check.setup
    args = argparse.Namespace(model=s.model, dtype=s.dtype, weights=False, path=None, prompt_len=64)
    adapter, weights, prompt = bench_latency.base_adapter(args, check.device)
    prompt_tokens = int(adapter.prompt_rows(prompt).shape[1])
    max_cache_len = -(-(prompt_tokens + adapter.layout.length + s.window) // 64) * 64
    check.adapter, check.prompt = adapter, prompt
    check.compiled = CompiledStep(adapter, max_cache_len, s.backend)
    return {"weights": weights, "weight_gb": module_bytes(adapter.model) / GB, "dtype": s.dtype,
            "prompt_tokens": prompt_tokens, "body_tokens": adapter.layout.length, "max_cache_len": max_cache_len}


def floor(check: Check) -> dict[str, Any]:
    step_bytes = bench_latency.step_weight_bytes(check.adapter.model)
    rate = bench_latency.copy_rate(check.device, (1 << 30) if check.device.type == "cuda" else (64 << 20))
    return {"step_weight_gb": step_bytes / GB, "h200_tb_s": H200_BANDWIDTH / 1e12,
            "floor_ms": 1e3 * step_bytes / H200_BANDWIDTH, "copy_tb_s": rate / 1e12,
            "floor_measured_copy_ms": 1e3 * step_bytes / rate}


def steps(check: Check) -> dict[str, Any]:
    s, out = check.setup, {}
    for path, compiled in (("eager", None), ("compiled", check.compiled)):
        out[path] = bench_latency.step_times(check.adapter, compiled, check.prompt, s.window, s.warmup, s.steps)
    q1, ql = (out["compiled"][f"q{q}"]["median_ms"] for q in (1, s.window))
    out["compiled_verify_over_step"] = ql / q1
    if check.results.get("floor", {}).get("ok"):  # how far the compiled step is from the bandwidth floor
        out["compiled_step_over_floor"] = q1 / check.results["floor"]["result"]["floor_ms"]
    return out


def agreement(check: Check) -> dict[str, Any]:
    """The same image (seed 0) on both paths: share of positions with equal tokens, and each path's NFE."""
    out = {}
    for name, window in (("ar", 1), ("sjd", check.setup.window)):
        gens = [JacobiEngine(check.adapter, SJD(), ChainDrafter(window=window), compiled=c).generate(check.prompt, 0)
                for c in (None, check.compiled)]
        equal = (gens[0].tokens == gens[1].tokens).float().mean().item()
        out[name] = {"equal_share": equal, "nfe_eager": gens[0].nfe, "nfe_compiled": gens[1].nfe}
    return out


def images(check: Check) -> dict[str, Any]:
    window = check.setup.window
    rules = {"ar": (SJD(), 1), "sjd": (SJD(), window), "csd": (CSD(lam=0.1, delta=0.5), window)}
    # one warm-up image per rule: it compiles the step with the engine's target and the rule's verification (the steps
    # part times the bare decode step, a graph of its own)
    out = {name: bench_latency.engine_times(check.adapter, check.compiled, rule, w, check.prompt, 1, 1)
           for name, (rule, w) in rules.items()}
    out["csd_minus_sjd_ms_per_iteration"] = out["csd"]["ms_per_iteration"] - out["sjd"]["ms_per_iteration"]
    if check.results.get("steps", {}).get("ok"):  # the engine's share outside the bare decode step (target included)
        step = check.results["steps"]["result"]["compiled"]
        for name, (_, w) in rules.items():
            out[name]["outside_step_share"] = 1 - step[f"q{w}"]["median_ms"] / out[name]["ms_per_iteration"]
    return out


def throughput(check: Check) -> dict[str, Any]:
    """SJD images/s per B on the compiled path (B timed images after one untimed, which compiles the B's shapes), and
    the allocator's peak."""
    s = check.setup
    if check.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(check.device)
    # one untimed image per B first: it compiles that B's shapes
    args = argparse.Namespace(batch_sizes=list(s.batch_sizes), warmup=1, images=1, rounds=1)
    by_batch = bench_throughput.bench_method(check.adapter, SJD(), s.window, [check.prompt], args,
                                             lambda text: print(f"  {text}", flush=True), check.compiled)
    peak = torch.cuda.max_memory_allocated(check.device) if check.device.type == "cuda" else None
    first, last = by_batch[s.batch_sizes[0]], by_batch[s.batch_sizes[-1]]
    return {"batches": by_batch, "largest_over_first": last["images_per_s"] / first["images_per_s"],
            "peak_bytes": peak}


def memory(check: Check) -> dict[str, Any]:
    """The plan at the throughput part's largest B (compiled) next to the measured peak (CUDA only)."""
    s, peak = check.setup, check.needs("throughput")["peak_bytes"]
    plan = plan_memory(model_shape(OmegaConf.load(CONF_DIR / "model" / f"{s.model}.yaml")), s.window, True,
                       check.device.type)
    planned = plan.total(s.batch_sizes[-1])
    return {"batch": s.batch_sizes[-1], "plan_gb": planned / GB, "plan_weights_gb": plan.shape.weight_bytes / GB,
            "plan_kv_per_image_gb": plan.kv_per_slot / GB,
            "measured_gb": None if peak is None else peak / GB, "measured_over_plan": None if peak is None else peak / planned,
            "note": None if peak is not None else "no allocator peak on CPU: only the plan"}


def overhead(check: Check) -> dict[str, Any]:
    s = check.setup
    rules = {"sjd": SJD(), "csd": CSD(lam=0.1, delta=0.5)}
    ver = bench_latency.verify_times(check.adapter.vocab_size, s.window, check.device, s.verify_reps, rules)
    return {"verify_sjd_ms": ver["sjd"], "verify_csd_ms": ver["csd"], "csd_overhead_ms": ver["csd"] - ver["sjd"]}


def exactness(check: Check) -> dict[str, Any]:
    """The compiled path (the check's backend: on CUDA inductor with CUDA graphs) against the eager one in fp32 on this
    device, on the tiny Janus: AR and SJD (``L = 8``) at batch 1, two seeds each, and SJD at B = 3 (refills, a padded
    last batch) against batch-1 eager images; the share of equal tokens of each. fp32 leaves kernel rounding ~1e-7,
    which flips a sample far more rarely than bf16 (``agreement``), so the compiled path, its CUDA-graph replays and
    the copies of their outputs are checked token for token (``min_equal_share`` 1.0)."""
    args = argparse.Namespace(model="janus_pro_tiny", dtype="float32", weights=False, path=None, prompt_len=64)
    adapter, _, prompt = bench_latency.base_adapter(args, check.device)
    compiled = CompiledStep(adapter, backend=check.setup.backend)
    seeds = (0, 1, 2, 3)

    def tokens(window: int, batch_size: int, compiled_step: CompiledStep | None, images: int) -> list[torch.Tensor]:
        engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=window), batch_size=batch_size, compiled=compiled_step)
        gens = {req.seed: gen.tokens for req, gen in engine.generate_many([Request(prompt, s) for s in seeds[:images]])}
        return [gens[seed] for seed in seeds[:images]]  # in seed order, whatever order the batch finished in

    def equal_share(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
        return sum(int((g == w).sum()) for g, w in zip(got, want[: len(got)], strict=True)) / sum(g.numel() for g in got)

    eager = {window: tokens(window, 1, None, len(seeds)) for window in (1, 8)}
    out: dict[str, Any] = {"ar": equal_share(tokens(1, 1, compiled, 2), eager[1]),
                           "sjd": equal_share(tokens(8, 1, compiled, 2), eager[8]),
                           "sjd_b3": equal_share(tokens(8, 3, compiled, len(seeds)), eager[8])}
    out["min_equal_share"] = min(out.values())
    return out


def rules(check: Check) -> dict[str, Any]:
    """Every rule class's compiled verification (the check's backend: on CUDA inductor's Triton code) against the eager
    one on this device, bit for bit, for its preset values and for every real-valued parameter moved, on one graph
    (``experiments.rule_exactness``). ``exactness`` decodes SJD only; here every rule's arithmetic is compared, where
    eager CUDA and the generated code may round a division differently."""
    out: dict[str, Any] = {}
    presets = rule_exactness.rule_presets()
    # a torch without isolate_recompiles keeps every graph of judge_windows under one recompile limit, which the
    # engine's verifications of the earlier parts may have filled: room for one graph per rule class
    limit = torch._dynamo.config.recompile_limit + len(presets)
    with torch._dynamo.config.patch(recompile_limit=limit):
        for method in presets:
            try:
                out[method] = rule_exactness.judge_case(method, check.setup.backend, check.device, fullgraph=False)
            except Exception as err:  # noqa: BLE001 - one rule's failure (a recompilation, say) is recorded
                out[method] = {"equal": False, "error": f"{type(err).__name__}: {err}"}
    return {"rules": out, "equal_share": sum(r["equal"] for r in out.values()) / len(out)}


def kernels(check: Check) -> dict[str, Any]:
    """The compiled ``q = 1`` step under the profiler (``bench_latency.step_kernels``): its top kernels and their sum
    per step next to the wall time per step, the data to tell a slow kernel from a waiting device."""
    return bench_latency.step_kernels(check.adapter, check.compiled, check.prompt, check.setup.window, 20)


def host_calls(check: Check) -> dict[str, Any]:
    """The engine's small calls, host CPU time per call, warm and after a compiled ``q = L`` step at a full image's
    context, synchronised and rolled back (``experiments.bench_cold_calls``)."""
    s = check.setup
    kinds = bench_cold_calls.call_kinds(check.adapter, s.window, s.backend)
    forward, _, _, _ = bench_latency.full_image_batch(check.adapter, check.compiled, check.prompt, s.window)

    def step() -> None:
        forward(s.window)
        forward.batch.rollback([s.window])
        synchronize(check.device)

    rows = bench_cold_calls.measure_calls(kinds, {"warm": None, "after forward": step}, s.host_calls, 3)
    return {row.pop("call"): row for row in rows}


RUNNERS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "floor": floor, "steps": steps, "agreement": agreement, "images": images, "throughput": throughput,
    "memory": memory, "overhead": overhead, "exactness": exactness, "kernels": kernels, "host_calls": host_calls,
    "rules": rules,
}


@dataclass(frozen=True)
class Target:
    """A number the check is judged against: the value at ``path`` in the results, at most (or at least) ``bound``."""

    name: str
    path: tuple[str, ...]
    bound: float
    at_most: bool
    unit: str

    def judge(self, results: dict[str, Any], judged: bool = True) -> dict[str, Any]:
        """The measured value next to the bound, ``passed`` None where nothing was measured or the run is not
        ``judged`` (a smoke run: the tiny model on a CPU says nothing about the 7B target on a GPU)."""
        part, *keys = self.path
        value: Any = results.get(part, {}).get("result")
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        passed = None if value is None or not judged else (value <= self.bound if self.at_most else value >= self.bound)
        sign = "<=" if self.at_most else ">="
        return {"target": self.name, "measured": value, "bound": f"{sign} {self.bound} {self.unit}", "passed": passed}


TARGETS = (
    Target("AR step (7B), compiled, q = 1", ("steps", "compiled", "q1", "median_ms"), 4.0, True, "ms"),
    Target("verify of L (32) tokens / single step, compiled", ("steps", "compiled_verify_over_step"), 1.15, True, "x"),
    Target("CSD overhead over SJD per iteration", ("overhead", "csd_overhead_ms"), 0.1, True, "ms"),
    Target("B = 16 / B = 1 throughput, SJD compiled", ("throughput", "largest_over_first"), 4.0, False, "x"),
    Target("compiled fp32 tokens equal to eager (tiny Janus)", ("exactness", "min_equal_share"), 1.0, False, "share"),
    Target("rule classes whose compiled verification equals eager", ("rules", "equal_share"), 1.0, False, "share"),
)


#: the ``passed`` cell of a smoke run's targets
NOT_JUDGED = "not judged"


def run_part(check: Check, name: str, runner: Callable[[Check], dict[str, Any]], start: float) -> None:
    """Run one part into ``check.results[name]``: its result and seconds, or its error; skipped past the budget (not
    the model, nor a part of :data:`DERIVED`)."""
    elapsed = time.perf_counter() - start
    print(f"[{elapsed:6.1f} s] {name}", flush=True)
    if name != "model" and name not in DERIVED and elapsed > check.setup.budget_s:
        check.results[name] = {"ok": False, "error": f"skipped: {elapsed:.0f} s elapsed > budget {check.setup.budget_s:.0f} s"}
        return
    began = time.perf_counter()
    try:
        if name != "model":
            check.needs("model")
        check.results[name] = {"ok": True, "result": runner(check)}
    except Exception as err:  # noqa: BLE001 - a failing part is recorded and the check goes on
        tail = traceback.format_exc().strip().splitlines()[-6:]
        check.results[name] = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": tail}
        print(f"  failed: {type(err).__name__}: {err}", flush=True)
    check.results[name]["seconds"] = time.perf_counter() - began


def fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def part_summary(name: str, result: dict[str, Any]) -> str:
    """One cell: a part's main numbers (per path, method or batch size for the nested ones)."""
    if name == "steps":
        paths = [f"{path}: q = 1 {r['q1']['median_ms']:.2f} ms, q = L "
                 f"{next(v['median_ms'] for k, v in r.items() if k.startswith('q') and k != 'q1'):.2f} ms, "
                 f"first calls {r['q1']['first_call_s']:.1f} s" for path, r in result.items() if isinstance(r, dict)]
        ratios = [f"{k}: {result[k]:.2f}" for k in ("compiled_verify_over_step", "compiled_step_over_floor") if k in result]
        return "; ".join(paths + ratios)
    if name == "agreement":
        return "; ".join(f"{m}: {r['equal_share']:.3f} of tokens equal, NFE {r['nfe_eager']} / {r['nfe_compiled']}"
                         for m, r in result.items())
    if name == "images":
        return "; ".join([f"{m}: {r['ms_per_iteration']:.2f} ms/iteration, NFE {r['nfe']:.0f}, {r['latency_s']:.2f} s"
                          + (f", {100 * r['outside_step_share']:.1f} % outside the step" if "outside_step_share" in r else "")
                          + (f" ({r['graphs_compiled_while_timed']} graphs compiled inside)"
                             if r.get("graphs_compiled_while_timed") else "")
                          for m, r in result.items() if isinstance(r, dict)]
                         + [f"CSD - SJD: {result['csd_minus_sjd_ms_per_iteration']:.2f} ms/iteration"])
    if name == "kernels":
        top = ", ".join(f"{k['name'][:40]} {100 * k['share']:.0f} %" for k in result["top"][:4])
        return (f"{result['kind']}: {result['self_ms_per_step']:.2f} ms per step of {result['wall_ms_per_step']:.2f} "
                f"ms wall; top: {top}")
    if name == "throughput":
        return "; ".join(f"B = {b}: {r['images_per_s']:.2f} images/s" for b, r in result["batches"].items())
    if name == "rules":
        return "; ".join(f"{m}: {'equal' if r['equal'] else r.get('error') or ', '.join(r['unequal'])}"
                         for m, r in result["rules"].items())
    if name == "host_calls":
        return "; ".join(f"{call}: {r['warm']:.0f} us warm, {r['after forward']:.0f} us after a step"
                         for call, r in result.items())
    return ", ".join(f"{k}: {fmt(v)}" for k, v in result.items())


def markdown(res: dict[str, Any]) -> str:
    """The summary: targets next to the measured values, then each part's status and main numbers."""
    meta = res["meta"]
    lines = [f"## GPU check: {meta['model']} (random weights), {meta['dtype']}, {meta['device_name']}"
             f"{f' (smoke run: targets {NOT_JUDGED})' if meta['smoke'] else ''}", "",
             f"torch {meta['torch']}, transformers {meta['transformers']}, window L = {meta['window']}, backend {meta['backend']}, {meta['wall_s']:.0f} s.",
             "", "| target | measured | bound | passed |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {fmt(t['measured'])} | {t['bound']} | "
              f"{NOT_JUDGED if meta['smoke'] else fmt(t['passed'])} |" for t in res["targets"]]
    lines += ["", "| part | status | seconds | result |", "|---|---|---|---|"]
    for name, part in res["parts"].items():
        status = "ok" if part["ok"] else f"**failed**: {part['error']}"
        summary = part_summary(name, part["result"]) if part["ok"] else ""
        lines.append(f"| {name} | {status} | {fmt(part.get('seconds'))} | {summary} |")
    lines += ["", "Random weights: the target law is near uniform, so NFE and step compression are meaningless; SJD and "
              "CSD are judged by ms per iteration."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU: the same parts on the tiny Janus (fp32, aot_eager)")
    p.add_argument("--out", type=Path, help="results directory (default results/bench; --smoke: runs/bench)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    args = p.parse_args(argv)
    args.parts = args.parts.split(",")
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        p.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup = SMOKE if args.smoke else FULL
    device = torch.device("cpu") if args.smoke else resolve_device("auto")
    out = args.out or Path("runs/bench" if args.smoke else "results/bench")
    torch.compiler.reset()
    check, start = Check(setup, device), time.perf_counter()

    def write(echo: bool = True) -> dict[str, Any]:
        res = {
            "meta": {"model": setup.model, "dtype": setup.dtype, "window": setup.window, "backend": setup.backend,
                     "smoke": args.smoke, "device": device.type, "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                     "batch_sizes": list(setup.batch_sizes), "wall_s": time.perf_counter() - start},
            "targets": [t.judge(check.results, judged=not args.smoke) for t in TARGETS],
            "parts": check.results,
        }
        bench_latency.write_results(res, out / f"gpu_check_{setup.model}_{device.type}", markdown(res), echo)
        return res

    for name, runner in (("model", build_model), *((p, RUNNERS[p]) for p in PARTS if p in args.parts)):
        run_part(check, name, runner, start)
        write(echo=False)  # after every part: a run killed at its time limit keeps what it measured
    return write()


if __name__ == "__main__":
    main()
