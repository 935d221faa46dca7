"""The generate stage: config -> prompts -> model adapter -> engine -> records + images (one straight line)."""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from csd.adapters.base import ModelAdapter
from csd.compose import Models, build_drafter, build_rule, load_prompts, method_params
from csd.decode import decode_tokens
from csd.device import resolve_device, synchronize
from csd.drafters.chain import ChainDrafter
from csd.engine import Generation, JacobiEngine
from csd.errors import ConfigError
from csd.limits import PROMPT_STRIDE, SEED_MODULUS, SEED_STRIDE
from csd.plan import resolve_batch_size
from csd.prompts import Prompt
from csd.records import ImageRecord, RecordWriter, image_name, load_records, records_file, shard_suffix
from csd.rundir import check_fingerprint, check_shards, generate_lock, shard_of
from csd.slot import Request
from csd.validate import validate

log = logging.getLogger(__name__)
RUN_INFO_FILE = "run.json"
T = TypeVar("T")


def image_seed(base: int, prompt_index: int, sample: int) -> int:
    """Seed of one image: stable under resume, distinct across prompts and samples (samples_per_prompt <= PROMPT_STRIDE
    and base < SEED_MODULUS: csd.limits)."""
    return (base * SEED_STRIDE + prompt_index * PROMPT_STRIDE + sample) % SEED_MODULUS


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Replace ``path`` with ``value`` as JSON atomically (readers never see half a file)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def run_info_file(cfg: DictConfig) -> str:
    """Where a generate pass writes its throughput and latency probe: ``run.json``, or for one shard of a
    sharded run ``run.shard-003-of-008.json`` (shards running at once would overwrite each other's)."""
    n = cfg.dataset.num_shards
    return RUN_INFO_FILE if n == 1 else f"run.{shard_suffix(cfg.dataset.shard, n)}.json"


def write_run_info(run_dir: Path, cfg: DictConfig, params: dict, model_info: dict, n_images: int) -> None:
    """``config.yaml`` and ``run.json``; a shard of a sharded run writes them only when run.json is missing or
    counts other images (the fingerprint already made every shard's settings equal)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_INFO_FILE
    if cfg.dataset.num_shards > 1 and path.exists() and json.loads(path.read_text()).get("n_images") == n_images:
        return
    tmp = run_dir / f"config.yaml.{os.getpid()}.tmp"
    tmp.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    os.replace(tmp, run_dir / "config.yaml")
    info = {
        "method": cfg.method.name,
        "method_params": params,
        "model": cfg.model.name,
        "model_info": model_info,
        "dataset": cfg.dataset.name,
        "seed": cfg.seed,
        "n_images": n_images,
        "batch_size": cfg.engine.batch_size,
        "threads": cfg.get("threads"),
        "host": platform.node(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
    }
    write_json(path, info)


def update_run_info(path: Path, **fields: Any) -> None:
    """Add ``fields`` to the JSON file ``path`` (created if missing; rewritten atomically)."""
    write_json(path, {**(json.loads(path.read_text()) if path.exists() else {}), **fields})


def run_settings(cfg: DictConfig) -> dict[str, Any]:
    """The method, model and method_params that run.json records for ``cfg``, as JSON: every record repeats
    them (a resume sets aside those that do not, :class:`RecordWriter`)."""
    params = method_params(cfg)
    return json.loads(json.dumps({"method": cfg.method.name, "model": cfg.model.name, "method_params": params}))


def make_record(
    cfg: DictConfig, params: dict, prompt: Prompt, index: int, sample: int, gen: Generation, vq_decode_s: float, grid
) -> ImageRecord:
    return ImageRecord(
        prompt_id=prompt.prompt_id,
        prompt=prompt.text,
        sample=sample,
        seed=image_seed(cfg.seed, index, sample),
        method=cfg.method.name,
        method_params=params,
        model=cfg.model.name,
        image=image_name(prompt.prompt_id, sample),
        tokens=gen.tokens.tolist(),
        grid=list(grid),
        nfe=gen.nfe,
        iterations=gen.nfe,
        step_compression=gen.step_compression,
        **gen.stats,
        # a batched image's times are shares of a batch, not the per-image latency the paper reports
        prefill_s=None if gen.batched else gen.prefill_s,
        decode_s=None if gen.batched else gen.decode_s,
        vq_decode_s=vq_decode_s,
        latency_s=None if gen.batched else gen.prefill_s + gen.decode_s,
        drafter_s=None if gen.batched else gen.drafter_s,
        commit_iter=gen.commit_iter.tolist(),
        commit_kind=gen.commit_kind.tolist(),
        entropy=[round(v, 4) for v in gen.entropy.tolist()],
        meta=dict(prompt.meta),
        batch_size=cfg.engine.batch_size,
    )


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C in the generate stage; the message says how many images are saved (every finished one is)."""


def generate_run(cfg: DictConfig, models: Models | None = None) -> Path:
    """Generate every (prompt, sample) of the dataset not yet in ``cfg.run_dir`` (resume-safe), with the model of
    ``models`` (``csd.compose.Models``: kept for the caller's next run; default: this run's own).

    Holds the directory's (or its shard's) lock and checks its fingerprint and shard count (csd.rundir)
    before the model loads, so a second writer or a resume with other settings is refused without adding a
    record. Records a resume cannot use (:class:`RecordWriter`; among them records whose method, model or
    method_params are not the run's, which the evaluate stage would refuse) are set aside and redone. With
    ``dataset.num_shards > 1`` only the prompts of shard ``dataset.shard`` (:func:`shard_of`) are generated,
    into the shard's own records file.
    """
    validate(cfg)
    resolve_batch_size(cfg)
    prompts = load_prompts(cfg.dataset)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    shard, num_shards = cfg.dataset.shard, cfg.dataset.num_shards
    with generate_lock(run_dir, shard, num_shards):
        check_fingerprint(run_dir, cfg, prompts)
        check_shards(run_dir, cfg, prompts)
        writer = RecordWriter(run_dir, records_file(shard, num_shards), expected=run_settings(cfg))
        try:
            generate_missing(cfg, prompts, writer, models or Models())
        except KeyboardInterrupt:
            keys = [
                (p.prompt_id, s) for p in prompts for s in range(cfg.dataset.samples_per_prompt)
                if shard_of(p.prompt_id, num_shards) == shard
            ]
            saved = sum(k in writer.done for k in keys)
            raise GenerationInterrupted(f"{saved} of {len(keys)} images saved in {run_dir}") from None
    return run_dir


def timed(items: Iterator[T]) -> Iterator[tuple[T, float]]:
    """Each item of ``items`` with the seconds spent producing it (the consumer's own time left out)."""
    while True:
        start = time.perf_counter()
        try:
            item = next(items)
        except StopIteration:
            return
        yield item, time.perf_counter() - start


def warm_up(cfg: DictConfig, engine: JacobiEngine, prompt: str) -> None:
    """``engine.warmup`` untimed generations (allocator / compile warm-up); compiled: trace the q = 1 step of
    ``engine``'s batch size too (reached only in a final one-row window)."""
    for _ in range(cfg.engine.warmup):
        engine.generate(prompt, seed=0)
    if engine.compiled is not None and engine.drafter.window > 1:
        JacobiEngine(engine.adapter, engine.rule, ChainDrafter(window=1), batch_size=engine.batch_size,
                     compiled=engine.compiled).generate(prompt, seed=0)


def check_fits(cfg: DictConfig, adapter: ModelAdapter, prompts: list[Prompt]) -> None:
    """What only the built model tells, checked before its first image: the window against the image's body length
    (``adapter.layout.length``: the toy's 256, Janus-Pro's 576, ...) and, compiled, the fixed cache against the
    prompts.

    A window longer than the image (a method preset's on a small model: one typed on the command line is refused,
    csd.limits) is logged (decoding is unchanged: a window never holds more than the positions left to decode) and
    refused with ``engine.compile=true``, which pads every window to its length. A compiled cache
    (``engine.max_cache_len``) must hold the longest prompt, the image and one window.
    """
    drafter = build_drafter(cfg.drafter)
    body, window = adapter.layout.length, drafter.window
    problem = drafter.window_problem(body, cfg.model.name)
    if problem is not None:
        if cfg.engine.compile:
            raise ConfigError(f"{problem} and engine.compile=true pads every window to its length: "
                              f"{drafter.window_fix(body)}")
        log.warning("%s: a window holds at most the tokens left to decode, so this run decodes as with windows of "
                    "%d entries (%s to say so)", problem, body, drafter.window_fix(body))
    if not cfg.engine.compile or cfg.engine.max_cache_len is None:
        return
    with torch.no_grad():
        entries = {p.prompt_id: max(len(row) for row in adapter.prompt_inputs(p.text)) - 1 for p in prompts}
    longest = max(entries, key=entries.get)
    need = entries[longest] + body + window
    if cfg.engine.max_cache_len < need:
        raise ConfigError(f"engine.max_cache_len={cfg.engine.max_cache_len} is too small for prompt {longest} "
                          f"({entries[longest]} cache entries, the image's {body} and a window of {window}): set "
                          f"engine.max_cache_len >= {need}, or null to size the cache for each prompt")


def generate_missing(cfg: DictConfig, prompts: list[Prompt], writer: RecordWriter, models: Models) -> None:
    """Load the model (``models``: or take the one it keeps) and generate the images ``writer`` does not have yet.

    Up to ``engine.batch_size`` images are decoded at once; each record is written as its image
    finishes (completion order; records are keyed by (prompt_id, sample)), so an interruption loses only
    the images in flight. run.json gets the pass's throughput (images / seconds spent in the engine) and,
    for a batched pass with ``engine.latency_probe``, the batch-1 latencies of the run's first images.
    """
    rule = build_rule(cfg.method)
    params = method_params(cfg)
    run_dir = writer.run_dir
    shard, num_shards = cfg.dataset.shard, cfg.dataset.num_shards
    todo = [
        (index, prompt, sample)
        for index, prompt in enumerate(prompts)
        if shard_of(prompt.prompt_id, num_shards) == shard
        for sample in range(cfg.dataset.samples_per_prompt)
        if (prompt.prompt_id, sample) not in writer.done
    ]
    n_images = len(prompts) * cfg.dataset.samples_per_prompt
    if not todo:
        log.info("%s: all %d images already generated", run_dir, n_images)
        return
    device = resolve_device(cfg.device)
    adapter = models.adapter(cfg.model, device)
    compiled = models.compiled(adapter, cfg.engine)
    check_fits(cfg, adapter, [prompt for _, prompt, _ in todo])
    write_run_info(run_dir, cfg, params, adapter.describe(), n_images)
    engine = JacobiEngine(adapter, rule, build_drafter(cfg.drafter), batch_size=cfg.engine.batch_size, compiled=compiled)
    warm_up(cfg, engine, todo[0][1].text)
    log.info("%s: %d of %d images to generate, %d at a time", run_dir, len(todo), n_images, cfg.engine.batch_size)
    requests = (Request(prompt.text, image_seed(cfg.seed, index, sample), key=(index, prompt, sample)) for index, prompt, sample in todo)
    results = timed(engine.generate_many(requests))
    engine_s = 0.0
    for (request, gen), seconds in tqdm(results, total=len(todo), desc=f"{cfg.method.name}", disable=not cfg.engine.progress):
        engine_s += seconds
        index, prompt, sample = request.key
        start = time.perf_counter()
        image = decode_tokens(adapter, gen.tokens)  # csd.decode: how every reader decodes a record without its PNG
        synchronize(device)
        vq_s = time.perf_counter() - start
        writer.write(make_record(cfg, params, prompt, index, sample, gen, vq_s, adapter.layout.grid), image)
    info_path = run_dir / run_info_file(cfg)
    update_run_info(
        info_path, throughput_images=len(todo), throughput_engine_s=engine_s, throughput_images_per_s=len(todo) / engine_s
    )
    if cfg.engine.batch_size > 1 and cfg.engine.latency_probe:
        probe = JacobiEngine(adapter, rule, build_drafter(cfg.drafter), compiled=compiled)
        update_run_info(info_path, latency_probe=latency_probe(cfg, probe, prompts, run_dir))


def latency_probe(cfg: DictConfig, engine: JacobiEngine, prompts: list[Prompt], run_dir: Path) -> list[dict[str, Any]]:
    """Batch-1 timings of the shard's first ``engine.latency_probe`` images (prompt order), decoded again.

    An image depends only on (prompt, seed), so its tokens must equal its batched record's; a mismatch
    (e.g. other GPU kernels for other batch shapes) is logged and recorded as ``tokens_match: false``.
    """
    tokens = {(r["prompt_id"], r["sample"]): r["tokens"] for r in load_records(run_dir)}
    shard, num_shards = cfg.dataset.shard, cfg.dataset.num_shards
    images = [
        (i, p, s) for i, p in enumerate(prompts) if shard_of(p.prompt_id, num_shards) == shard
        for s in range(cfg.dataset.samples_per_prompt)
    ]
    images = images[: cfg.engine.latency_probe]
    warm_up(cfg, engine, images[0][1].text)
    out = []
    for index, prompt, sample in images:
        seed = image_seed(cfg.seed, index, sample)
        gen = engine.generate(prompt.text, seed=seed)
        match = gen.tokens.tolist() == tokens[(prompt.prompt_id, sample)]
        if not match:
            log.warning("latency probe: %s sample %d decoded at batch 1 differs from its batched record", prompt.prompt_id, sample)
        out.append({
            "prompt_id": prompt.prompt_id, "sample": sample, "seed": seed, "nfe": gen.nfe, "prefill_s": gen.prefill_s,
            "decode_s": gen.decode_s, "drafter_s": gen.drafter_s, "latency_s": gen.prefill_s + gen.decode_s,
            "tokens_match": match,
        })
    log.info("%s: latency probe of %d images at batch 1", run_dir, len(out))
    return out
