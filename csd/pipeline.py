"""The generate stage: config -> prompts -> model adapter -> engine -> records + images (one straight line)."""

from __future__ import annotations

import json
import logging
import platform
import time
from pathlib import Path

import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from csd.config import build_adapter, build_rule, load_prompts, method_params, resolve_device, validate
from csd.engine import Generation, JacobiEngine, synchronize
from csd.prompts import Prompt
from csd.records import ImageRecord, RecordWriter, image_name
from csd.rundir import check_fingerprint, generate_lock

log = logging.getLogger(__name__)


def image_seed(base: int, prompt_index: int, sample: int) -> int:
    """Seed of one image: stable under resume, distinct across prompts and samples."""
    return (base * 1_000_003 + prompt_index * 1_009 + sample) % (2**62)


def write_run_info(run_dir: Path, cfg: DictConfig, params: dict, model_info: dict, n_images: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    info = {
        "method": cfg.method.name,
        "method_params": params,
        "model": cfg.model.name,
        "model_info": model_info,
        "dataset": cfg.dataset.name,
        "seed": cfg.seed,
        "n_images": n_images,
        "threads": cfg.get("threads"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
    }
    (run_dir / "run.json").write_text(json.dumps(info, indent=2))


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
        prefill_s=gen.prefill_s,
        decode_s=gen.decode_s,
        vq_decode_s=vq_decode_s,
        latency_s=gen.prefill_s + gen.decode_s,
        commit_iter=gen.commit_iter.tolist(),
        commit_kind=gen.commit_kind.tolist(),
        entropy=[round(v, 4) for v in gen.entropy.tolist()],
        meta=dict(prompt.meta),
    )


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C in the generate stage; the message says how many images are saved (every finished one is)."""


def generate_run(cfg: DictConfig) -> Path:
    """Generate every (prompt, sample) of the dataset not yet in ``cfg.run_dir`` (resume-safe).

    Holds the directory's lock and checks its fingerprint (csd.rundir) before the model loads, so a
    second writer or a resume with other settings is refused without adding a record.
    """
    validate(cfg)
    prompts = load_prompts(cfg.dataset)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with generate_lock(run_dir):
        check_fingerprint(run_dir, cfg, prompts)
        writer = RecordWriter(run_dir)
        try:
            generate_missing(cfg, prompts, writer)
        except KeyboardInterrupt:
            keys = [(p.prompt_id, s) for p in prompts for s in range(cfg.dataset.samples_per_prompt)]
            saved = sum(k in writer.done for k in keys)
            raise GenerationInterrupted(f"{saved} of {len(keys)} images saved in {run_dir}") from None
    return run_dir


def generate_missing(cfg: DictConfig, prompts: list[Prompt], writer: RecordWriter) -> None:
    """Load the model and generate the images ``writer`` does not have yet."""
    rule = build_rule(cfg.method)
    params = method_params(cfg.method)
    run_dir = writer.run_dir
    todo = [
        (index, prompt, sample)
        for index, prompt in enumerate(prompts)
        for sample in range(cfg.dataset.samples_per_prompt)
        if (prompt.prompt_id, sample) not in writer.done
    ]
    n_images = len(prompts) * cfg.dataset.samples_per_prompt
    if not todo:
        log.info("%s: all %d images already generated", run_dir, n_images)
        return
    device = resolve_device(cfg.device)
    adapter = build_adapter(cfg.model, device, cfg.engine)
    write_run_info(run_dir, cfg, params, adapter.describe(), n_images)
    m = cfg.method
    engine = JacobiEngine(adapter, rule, m.window, m.init, pad_window=cfg.engine.compile, coupling=m.coupling)
    for _ in range(cfg.engine.warmup):  # compile / allocator warm-up, not recorded
        engine.generate(todo[0][1].text, seed=0)
    if cfg.engine.compile and cfg.method.window > 1:  # trace q = 1 too (reached only in a final one-row window)
        JacobiEngine(adapter, rule, window=1, pad_window=True).generate(todo[0][1].text, seed=0)
    log.info("%s: %d of %d images to generate", run_dir, len(todo), n_images)
    for index, prompt, sample in tqdm(todo, desc=f"{cfg.method.name}", disable=not cfg.engine.progress):
        gen = engine.generate(prompt.text, seed=image_seed(cfg.seed, index, sample))
        start = time.perf_counter()
        image = adapter.decode_images(gen.tokens.unsqueeze(0))[0].numpy()
        synchronize(device)
        vq_s = time.perf_counter() - start
        writer.write(make_record(cfg, params, prompt, index, sample, gen, vq_s, adapter.layout.grid), image)
