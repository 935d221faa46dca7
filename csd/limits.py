"""Upper bounds of the knobs that scale a run's memory or time, each derived from what the knob means (docs/USAGE.md,
"Limits"), checked before any model loads.

Every check returns the one-line problem of a value, naming the bound and where it comes from (None: within it);
:func:`csd.validate.validate` raises :func:`config_problem`'s with what the config tells, :func:`csd.cli.check_inputs`
again with the run's prompts once they are loaded. Memory bounds use the memory planner (:mod:`csd.plan`) and the
machine's available RAM; on CUDA only ``engine.memory_gb`` bounds the batch and the captions (measuring the GPU
would initialise CUDA before a shard picks its GPU, and a GPU out of memory stops only this run).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from csd.drafters.base import Drafter
from csd.plan import FAMILIES, GB, MemoryPlan, ModelShape, available_memory, gb, model_shape, plan_memory
from csd.prompts import Prompt

#: image seeds (csd.pipeline.image_seed): ``(seed x SEED_STRIDE + prompt index x PROMPT_STRIDE + sample) mod
#: SEED_MODULUS``, so a base seed >= SEED_MODULUS repeats a smaller one's images and sample PROMPT_STRIDE of a prompt
#: would take the next prompt's first seed
SEED_MODULUS = 2**62
SEED_STRIDE = 1_000_003
PROMPT_STRIDE = 1_009
#: bytes per (resample, prompt) of the cluster bootstrap (csd.evaluation.intervals.Resamples.draw): the drawn
#: indices, the same offset per resample, their bincount and its float copy, int64 / float64 each
RESAMPLE_BYTES = 4 * 8
#: bytes per bin of acceptance vs entropy (csd.evaluation.content.acceptance_by_entropy, written to metrics.json):
#: six float64 arrays (48), four Python lists of floats (128) and the indented JSON text with its chunks (~330)
BIN_BYTES = 512


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a SLURM allocation or ``taskset``; else every core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_problem(threads: int | None) -> str | None:
    """More intra-op threads than cores only makes them wait for each other (and torch maps a stack per thread)."""
    cores = usable_cores()
    if threads is None or threads <= cores:
        return None
    return (f"threads={threads} is more than the {cores} cores this process may use (os.sched_getaffinity): set "
            f"threads <= {cores}, or null for torch's default")


def seed_problem(seed: int) -> str | None:
    """Image seeds are taken mod :data:`SEED_MODULUS`: a larger base seed only repeats a smaller one's images."""
    if seed < SEED_MODULUS:
        return None
    return (f"seed={seed} must be an integer in [0, {SEED_MODULUS - 1}]: image seeds are taken mod 2**62 "
            "(csd.pipeline.image_seed), so a larger seed repeats the images of a smaller one")


def samples_problem(samples: int) -> str | None:
    """Sample :data:`PROMPT_STRIDE` of a prompt would decode with the seed of the next prompt's first sample."""
    if samples <= PROMPT_STRIDE:
        return None
    return (f"dataset.samples_per_prompt={samples} must be <= {PROMPT_STRIDE}: image seeds are seed x {SEED_STRIDE} + "
            f"prompt index x {PROMPT_STRIDE} + sample (csd.pipeline.image_seed), so sample {PROMPT_STRIDE} would reuse "
            "the next prompt's seed")


def shape_of(model: DictConfig) -> ModelShape | None:
    """The model's :class:`csd.plan.ModelShape` from its config (no weight read); None for a model family the planner
    does not know (a model of one's own)."""
    return model_shape(model) if model._target_.rsplit(".", 1)[-1] in FAMILIES else None


def top_k_problem(top_k: int | None, model: str, shape: ModelShape) -> str | None:
    """Top-k keeps ``k`` of the image codes: more than the codebook holds keeps nothing out and cannot be selected."""
    if top_k is None or top_k <= shape.image_vocab:
        return None
    return (f"model.top_k={top_k} is more than model={model}'s {shape.image_vocab} image codes (its codebook, "
            f"{shape.source}): set model.top_k <= {shape.image_vocab}, or null for no top-k")


def device_memory(cfg: DictConfig) -> tuple[float, str] | None:
    """The memory budget of the decoding device and where it comes from: ``engine.memory_gb``, else the available RAM
    of a CPU run; None on CUDA without ``engine.memory_gb`` (see the module docstring)."""
    if cfg.engine.memory_gb is not None:
        return cfg.engine.memory_gb * GB, "engine.memory_gb"
    return (available_memory(torch.device("cpu")), "available RAM") if on_cpu(cfg) else None


def on_cpu(cfg: DictConfig) -> bool:
    """Whether the run decodes on the CPU (``device=cpu``, or ``auto`` without CUDA), without initialising CUDA."""
    return cfg.device == "cpu" or (cfg.device == "auto" and torch.cuda.device_count() == 0)  # NVML: no cuInit


def batch_problem(batch: int, images: int | None, counted: str, model: str, plan: MemoryPlan | None,
                  memory: tuple[float, str] | None) -> str | None:
    """A batch holds one image per slot: more slots than the run's ``images`` (``counted``: how) are never filled,
    and every slot holds its KV cache and activations (``plan``: the memory plan) in ``memory``."""
    if images is not None and batch > images:
        return (f"engine.batch_size={batch} is more than the run's {images} images ({counted}): the other slots are "
                f"never filled; set engine.batch_size <= {images}")
    if plan is None or memory is None or plan.total(batch) <= memory[0]:
        return None
    fits = plan.max_batch(memory[0])
    return (f"engine.batch_size={batch} needs {gb(plan.total(batch))} GB by the memory plan of model={model} (csd.plan), "
            f"more than the {gb(memory[0])} GB of {memory[1]}: "
            + (f"set engine.batch_size <= {fits} (or auto)" if fits else "not even one image fits"))


def warmup_problem(warmup: int, images: int | None, counted: str) -> str | None:
    """Warm-up generations are untimed copies of the run's first image: more of them than the run's images is no
    warm-up but a longer run (one generation warms the allocator; compiled, the graphs)."""
    if images is None or warmup <= images:
        return None
    return (f"engine.warmup={warmup} is more than the run's {images} images ({counted}): each warm-up is one untimed "
            f"generation, and one already warms the allocator and compiled graphs; set engine.warmup <= {images}")


def bootstrap_problem(n_boot: int, n_prompts: int, ram: int) -> str | None:
    """The cluster bootstrap holds :data:`RESAMPLE_BYTES` per resample and prompt at once."""
    need = n_boot * n_prompts * RESAMPLE_BYTES
    if need <= ram:
        return None
    fits = ram // (n_prompts * RESAMPLE_BYTES)
    return (f"eval.bootstrap={n_boot} needs {gb(need)} GB ({n_boot} resamples x {n_prompts} prompts x {RESAMPLE_BYTES} "
            f"bytes, csd.evaluation.intervals), more than the {gb(ram)} GB of available RAM: set eval.bootstrap <= {fits}")


def bins_problem(bins: int, ram: int) -> str | None:
    """Acceptance vs entropy holds :data:`BIN_BYTES` per bin while metrics.json is written."""
    need = bins * BIN_BYTES
    if need <= ram:
        return None
    return (f"eval.content.entropy_bins={bins} needs {gb(need)} GB ({BIN_BYTES} bytes a bin in metrics.json, "
            f"csd.evaluation.content), more than the {gb(ram)} GB of available RAM: set eval.content.entropy_bins <= "
            f"{ram // BIN_BYTES}")


def config_problem(cfg: DictConfig, drafter: Drafter, n_prompts: int | None = None) -> str | None:
    """The first value of ``cfg`` past its bound (None: none is). ``n_prompts``: the run's prompts once they are loaded
    (:func:`csd.cli.check_inputs`), else ``dataset.n_prompts`` for the bounds that count images (a batch or warm-up
    longer than the run); the bootstrap counts loaded prompts only (one before), so a ``dataset.n_prompts`` larger
    than the dataset is named as such (:func:`csd.compose.load_prompts`), not as resamples that would not fit."""
    loaded = n_prompts
    n_prompts = n_prompts if n_prompts is not None else OmegaConf.select(cfg, "dataset.n_prompts")
    samples = cfg.dataset.samples_per_prompt
    images = None if n_prompts is None else n_prompts * samples
    counted = f"{n_prompts} prompts x dataset.samples_per_prompt={samples}"
    problem = threads_problem(cfg.threads) or seed_problem(cfg.seed) or samples_problem(samples)
    if problem:
        return problem
    shape = shape_of(cfg.model)
    if shape is not None:
        problem = top_k_problem(cfg.model.get("top_k"), cfg.model.name, shape)
        if problem:
            return problem
    batch = cfg.engine.batch_size
    if batch != "auto":
        memory = device_memory(cfg) if shape is not None and batch > 1 else None
        plan = None
        if memory is not None:
            plan = plan_memory(shape, drafter.forward_entries(shape.grid, shape.body_len), cfg.engine.compile,
                               "cpu" if on_cpu(cfg) else "cuda", cfg.drafter.get("coupling") == "gumbel")
        problem = batch_problem(batch, images, counted, cfg.model.name, plan, memory)
    ram = available_memory(torch.device("cpu"))
    return (problem or warmup_problem(cfg.engine.warmup, images, counted)
            or bootstrap_problem(cfg.eval.bootstrap, loaded or 1, ram)
            or bins_problem(cfg.eval.content.entropy_bins, ram))


#: the settings that make a drafter's windows longer (``method.window``: the deprecated name of ``drafter.window``)
WINDOW_KEYS = ("drafter.window", "drafter.gamma", "method.window")


def typed_window_problem(model: DictConfig, drafter: Drafter, overrides: Sequence[str]) -> str | None:
    """A window longer than the image, set on the command line (``overrides``): it only decodes as one of the image's
    length, so the value typed is refused. A method preset's window longer than a small model's image is left to
    the run, which logs it (csd.pipeline.check_fits)."""
    typed = {arg.split("=", 1)[0].lstrip("+~") for arg in overrides if "=" in arg}
    shape = shape_of(model)
    if shape is None or typed.isdisjoint(WINDOW_KEYS):
        return None
    problem = drafter.window_problem(shape.body_len, model.name)
    if problem is None:
        return None
    return f"{problem}: a window holds at most the tokens left to decode; {drafter.window_fix(shape.body_len)}"


def caption_problem(prompts: Sequence[Prompt], model: DictConfig, drafter: Drafter, where: str) -> str | None:
    """A caption longer than the model's positions can hold next to its image and a window (a token covers at least
    one UTF-8 byte of its caption, so bytes bound the tokens from above); its prefill's attention grows with the
    square of its length. Models whose prompt has a fixed length (the toy, LlamaGen's 120 caption tokens) take any
    caption. ``where``: the setting that names the prompts' file."""
    shape = shape_of(model)
    if shape is None or shape.caption_positions is None:
        return None
    window = drafter.forward_entries(shape.grid, shape.body_len)
    room = shape.caption_positions - shape.body_len - window
    index, longest = max(enumerate(prompts), key=lambda p: len(p[1].text.encode("utf-8")))
    size = len(longest.text.encode("utf-8"))
    if size <= room:
        return None
    return (f"{where}: prompt {index} ({longest.prompt_id}) is {size} bytes long; model={model.name} holds "
            f"{shape.caption_positions} positions: its image ({shape.body_len} tokens), a window ({window}) and at most "
            f"{room} bytes of caption; shorten or drop that prompt")

