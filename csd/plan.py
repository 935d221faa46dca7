"""The memory planner (docs/PERFORMANCE.md, "Memory plan"): how many images fit on a device, before any weight loads.

From a ``conf/model/`` config alone (for the real checkpoints: the transformers config shapes of :data:`REAL_SHAPES`;
the model is instantiated on the ``meta`` device, which allocates nothing, to count its weights) the plan adds up

* the weights: every parameter and buffer of the model the adapter holds, in its dtype;
* the KV cache of one image slot: CFG rows x cache length x layers x KV heads x head dim x 2 (keys, values) x dtype
  bytes, with the cache length ``csd.cache.default_cache_len`` gives (prompt + body + window reserve, rounded up);
* the activations of one slot's window forward (:func:`activation_bytes`) and the drafter's fp32 state per slot;
* the cache's causal-mask table: ``cache length^2`` in the model dtype, once (``csd.cache.RaggedCache.causal_masks``);
* a workspace allowance: a fixed reserve on CUDA (allocator, library workspaces) and, compiled, the two captured
  graphs' private activations;

and :meth:`MemoryPlan.max_batch` is the largest ``engine.batch_size`` whose total fits a memory budget
(``engine.memory_gb``, default: the free memory of the device). ``python -m csd.plan`` prints the table of every
``model=`` preset on 24 / 40 / 80 / 141 GB.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from csd.adapters.shapes import EMU3_GRID, REAL_SHAPES, real_janus_config, real_text_config
from csd.cache import default_cache_len
from csd.device import GB, available_memory, gb

#: the device sizes of the planner's table (GB): 24 GB consumer cards, A100 40 / 80 GB, H200 141 GB
TABLE_GB = (24, 40, 80, 141)
#: prompt length planned for every model but the toy (whose prompts have one length): tokens, the latency benchmark's
#: synthetic prompt; the cache length rounds prompt + body + 64 up to a multiple of 256, so nearby lengths plan the same
PROMPT_LEN = 64
#: fp32 ``[window, image vocab]`` tensors alive per slot during an iteration: target q, its log, the race noise,
#: the carried draft laws, the residual, the acceptance inputs (csd.verify, csd.drafters.chain)
FP32_COPIES = 6
#: CUDA reserve outside the plan's tensors (allocator rounding, cuBLAS / attention workspaces), GB
CUDA_RESERVE_GB = 1.0
#: the largest batch the planner searches
MAX_BATCH = 4096

@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: its weights and the shapes of its decoder, body, prompt and logits."""

    name: str
    weight_bytes: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    logit_columns: int
    image_vocab: int
    body_len: int
    grid: tuple[int, int]
    prompt_len: int
    cfg_rows: int
    dtype_bytes: int
    source: str
    #: the positions a caption shares with the image (the text config's ``max_position_embeddings``); None for a
    #: prompt of fixed length (the toy's, LlamaGen's caption embeddings)
    caption_positions: int | None = None


def module_bytes(module: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of ``module``'s parameters and buffers (in ``dtype`` for floating tensors when given)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * (torch.empty(0, dtype=dtype).element_size() if dtype and t.is_floating_point()
                            else t.element_size()) for t in tensors)


def on_meta(build: Any, *args: Any) -> torch.nn.Module:
    """``build(*args)`` instantiated on the meta device: shapes without memory."""
    with torch.device("meta"):
        return build(*args)


def decoder_dims(text: Any) -> dict[str, int]:
    """Layers, heads, KV heads, head dim, hidden and intermediate sizes of a transformers text config."""
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return dict(layers=text.num_hidden_layers, heads=text.num_attention_heads,
                kv_heads=text.num_key_value_heads, head_dim=head_dim, hidden=text.hidden_size,
                intermediate=text.intermediate_size)


def janus_config(model: DictConfig) -> tuple[Any, str]:
    """The tiny config (its generator's arguments) or the real shape of :data:`REAL_SHAPES`."""
    from csd.adapters.janus import tiny_janus_config

    if model.name not in REAL_SHAPES:
        return tiny_janus_config(model.grid, model.codebook), "tiny config"
    layers = model.get("layers")
    source = "REAL_SHAPES (hub config.json)" + ("" if layers is None else f", {layers} decoder layers (the rehearsal)")
    return real_janus_config(model.name, layers), source


def janus_shape(model: DictConfig) -> dict[str, Any]:
    from transformers import JanusForConditionalGeneration

    config, source = janus_config(model)
    side = int(round(config.vision_config.num_image_tokens ** 0.5))
    return dict(model=on_meta(JanusForConditionalGeneration, config), text=config.text_config, source=source,
                logit_columns=config.vq_config.num_embeddings, image_vocab=config.vq_config.num_embeddings,
                body_len=side * side, grid=(side, side), prompt_len=PROMPT_LEN,
                caption_positions=config.text_config.max_position_embeddings)


def chameleon_shape(model: DictConfig, real: str, real_grid: tuple[int, int] | None,
                    body_len: Callable[[int, int], int]) -> dict[str, Any]:
    """A Chameleon-family model (Lumina-mGPT, Anole): the tiny config of a preset with ``codes``, else the real shape
    of :data:`REAL_SHAPES` ``real`` with Meta's VQGAN; its grid is ``real_grid`` or ``resolution // 16`` a side;
    ``body_len(rows, cols)`` counts its body positions."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from csd.adapters.lumina import tiny_lumina_config, tiny_vqgan_config
    from csd.adapters.vqgan import VQGANConfig, VQGANDecoder

    if "codes" in model:
        config, _ = tiny_lumina_config(model.codes, model.seed)
        vqgan, (rows, cols), source = tiny_vqgan_config(model.codes), tuple(model.grid), "tiny config"
    else:  # the image vocabulary map only names the image token here: no tokenizer offline
        layers = model.get("layers")
        config = ChameleonConfig(**real_text_config(real, layers), vocabulary_map={"<image>": 8711})
        vqgan = VQGANConfig()
        source = "REAL_SHAPES (hub config.json)" + ("" if layers is None else f", {layers} decoder layers (the rehearsal)")
        rows, cols = real_grid or (model.resolution // vqgan.downsample,) * 2
    lm = on_meta(ChameleonForConditionalGeneration, config)
    decoder = on_meta(VQGANDecoder, vqgan)
    return dict(model=lm, extra_bytes=module_bytes(decoder, torch.float32), text=config, source=source, logit_columns=config.vocab_size, image_vocab=vqgan.n_embed,
                body_len=body_len(rows, cols), grid=(rows, cols), prompt_len=PROMPT_LEN,
                caption_positions=config.max_position_embeddings if "codes" in model else None)


def lumina_shape(model: DictConfig) -> dict[str, Any]:
    """The header (3), ``rows`` x (``cols`` + EOL) and ``<eoss>``."""
    return chameleon_shape(model, "lumina_mgpt_7b", None, lambda rows, cols: 3 + rows * (cols + 1) + 1)


def anole_shape(model: DictConfig) -> dict[str, Any]:
    """``rows`` x ``cols`` image tokens (32 x 32 at 512 px), nothing else."""
    from csd.adapters.anole import ANOLE_GRID

    return chameleon_shape(model, "anole_7b", ANOLE_GRID, lambda rows, cols: rows * cols)


def emu3_shape(model: DictConfig) -> dict[str, Any]:
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from csd.adapters.emu3 import tiny_emu3_config

    if model.name == "emu3_tiny":
        config, (rows, cols), source = tiny_emu3_config(model.codes, model.seed), tuple(model.grid), "tiny config"
    else:  # only the end-of-line name is read at construction
        layers = model.get("layers")
        config = Emu3Config(text_config=real_text_config("emu3_gen", layers), vocabulary_map={"<|extra_200|>": 151846})
        (rows, cols) = EMU3_GRID
        source = "REAL_SHAPES (hub config.json)" + ("" if layers is None else f", {layers} decoder layers (the rehearsal)")
    return dict(model=on_meta(Emu3ForConditionalGeneration, config), text=config.text_config, source=source,
                logit_columns=config.text_config.vocab_size, image_vocab=config.vq_config.codebook_size,
                body_len=rows * (cols + 1) + 2, grid=(rows, cols), prompt_len=PROMPT_LEN,
                caption_positions=config.text_config.max_position_embeddings if model.name == "emu3_tiny" else None)


def toy_shape(model: DictConfig) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from csd.toy import LM_DIR
    from csd.toy.tokenizer import GRID
    from csd.toy.vocab import PROMPT_LEN

    config = LlamaConfig.from_dict(json.loads((LM_DIR / "config.json").read_text()))
    if "layers" in model:  # model=toy_draft: the toy's first layers (csd.adapters.toy.load_toy_draft_adapter)
        config.num_hidden_layers = model.layers
    return dict(model=on_meta(LlamaForCausalLM, config), text=config, source=f"{LM_DIR.name}/config.json",
                logit_columns=config.vocab_size, image_vocab=GRID * GRID, body_len=GRID * GRID, grid=(GRID, GRID),
                prompt_len=PROMPT_LEN)


def llamagen_shape(model: DictConfig) -> dict[str, Any]:
    """Our LlamaGen GPT (csd/adapters/llamagen_gpt.py) of the preset's shape; the caption encoder (flan-t5-xl, 1.2 B
    parameters in the encoder half) is counted from its transformers config."""
    from transformers import T5Config, T5EncoderModel

    from csd.adapters.base import resolve_dtype
    from csd.adapters.llamagen import (
        GPT_SHAPES,
        decoder_only,
        tiny_llamagen_config,
        tiny_vq16_config,
        vq16_config,
    )
    from csd.adapters.llamagen_gpt import LlamaGenConfig, LlamaGenGPT

    if "gpt_model" in model:
        layers, heads, width = GPT_SHAPES[model.gpt_model]
        grid, t2i = model.image_size // 16, model.kind == "t2i"
        config = LlamaGenConfig(model_type=model.kind, hidden_size=width, num_hidden_layers=layers,
                                num_attention_heads=heads, cls_token_num=120 if t2i else 1, grid=grid)
        source, encoder = "GPT_SHAPES (the original's GPT_models)", T5Config.from_dict(FLAN_T5_XL) if t2i else None
        vq = vq16_config(grid)
    else:
        config, grid, encoder = tiny_llamagen_config(model.kind, model.grid, model.codebook), model.grid, None
        source, vq = "tiny config", tiny_vq16_config(model.grid, model.codebook)
    extra = module_bytes(on_meta(decoder_only, vq), torch.float32)  # the VQ decoder runs in fp32
    if encoder is not None:
        extra += module_bytes(on_meta(T5EncoderModel, encoder), resolve_dtype(model.dtype))
    return dict(model=on_meta(LlamaGenGPT, config), extra_bytes=extra, text=config, source=source,
                logit_columns=config.vocab_size, image_vocab=config.vocab_size, body_len=grid * grid, grid=(grid, grid),
                prompt_len=config.cls_token_num)


#: flan-t5-xl's encoder shape (google/flan-t5-xl config.json)
FLAN_T5_XL = dict(vocab_size=32128, d_model=2048, d_kv=64, d_ff=5120, num_layers=24, num_heads=32,
                  feed_forward_proj="gated-gelu")


#: the loader function named by a model config's ``_target_`` -> how its shape is read
FAMILIES = {
    "load_toy_adapter": toy_shape, "load_toy_draft_adapter": toy_shape,
    "load_toy_textured_adapter": toy_shape, "load_toy_textured_outline_adapter": toy_shape,  # the toy LM continued
    "tiny_janus_adapter": janus_shape, "load_janus_adapter": janus_shape,
    "tiny_lumina_adapter": lumina_shape, "load_lumina_adapter": lumina_shape,
    "tiny_emu3_adapter": emu3_shape, "load_emu3_adapter": emu3_shape,
    "tiny_llamagen_adapter": llamagen_shape, "load_llamagen_adapter": llamagen_shape,
    "tiny_anole_adapter": anole_shape, "load_anole_adapter": anole_shape,
}


def model_shape(model: DictConfig) -> ModelShape:
    """The :class:`ModelShape` of a ``conf/model/`` config, from configs only (no weight is read or allocated)."""
    from csd.adapters.base import resolve_dtype

    family = FAMILIES.get(model._target_.rsplit(".", 1)[-1])
    if family is None:
        raise ValueError(f"model={model.name}: the memory planner knows no shapes for {model._target_}")
    dtype = resolve_dtype(model.dtype)
    parts = family(model)
    weights = module_bytes(parts["model"], dtype) + parts.get("extra_bytes", 0)  # Lumina's VQGAN decoder runs in fp32
    return ModelShape(
        name=model.name, weight_bytes=weights, **decoder_dims(parts["text"]), logit_columns=parts["logit_columns"],
        image_vocab=parts["image_vocab"], body_len=parts["body_len"], grid=parts["grid"], prompt_len=parts["prompt_len"],
        cfg_rows=2 if model.guidance_scale != 1 else 1, dtype_bytes=torch.empty(0, dtype=dtype).element_size(),
        source=parts["source"], caption_positions=parts.get("caption_positions"),
    )


def activation_bytes(shape: ModelShape, q: int, keys: int) -> int:
    """Transient bytes of one slot's forward of ``q`` tokens over ``keys`` cache entries: per CFG row and token, in the
    model dtype, the hidden states and projections (6 x hidden), the MLP (3 x intermediate), the attention scores
    (heads x keys, materialised by the non-fused kernels) and the raw logits; then ``FP32_COPIES`` fp32 tensors of
    ``[q, image vocab]`` for the target and the verification."""
    per_token = 6 * shape.hidden + 3 * shape.intermediate + shape.heads * keys + shape.logit_columns
    return shape.cfg_rows * q * per_token * shape.dtype_bytes + FP32_COPIES * q * shape.image_vocab * 4


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of one model decoded with ``window``-token windows: fixed parts, per-slot parts, and the batch that fits."""

    shape: ModelShape
    window: int
    compiled: bool
    device_type: str
    cache_len: int
    kv_per_slot: int
    activations_per_slot: int
    prefill_activations: int
    compile_per_slot: int
    gumbel_per_slot: int
    reserve: int
    mask_table: int

    def total(self, batch: int) -> int:
        """Planned peak bytes at ``batch`` slots: weights, reserve, the causal-mask table, every slot's KV cache (and
        compiled, its share of the graphs' memory), and the larger transient: every slot's window forward, or one slot's
        prefill."""
        held = self.shape.weight_bytes + self.reserve + self.mask_table + batch * (self.kv_per_slot + self.compile_per_slot
                                                                 + self.gumbel_per_slot)
        return held + max(batch * self.activations_per_slot, self.prefill_activations)

    def max_batch(self, memory_bytes: float) -> int:
        """The largest batch (at most ``MAX_BATCH``) whose :meth:`total` fits ``memory_bytes``; 0: not one image."""
        return next((b for b in range(MAX_BATCH, 0, -1) if self.total(b) <= memory_bytes), 0)


def plan_memory(shape: ModelShape, window: int, compiled: bool, device_type: str, gumbel: bool = False) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``shape`` (the formulas of the module docstring); ``gumbel``: the chain drafter's
    Gumbel sharing holds one fp32 ``Exp(1)`` vector per body position per image."""
    cache_len = default_cache_len(shape.prompt_len - 1, shape.body_len)  # the prompt's last token is the first anchor
    kv = shape.cfg_rows * cache_len * shape.layers * shape.kv_heads * shape.head_dim * 2 * shape.dtype_bytes
    window_act = activation_bytes(shape, window, cache_len)
    graphs = activation_bytes(shape, window, cache_len) + activation_bytes(shape, 1, cache_len) if compiled else 0
    return MemoryPlan(
        shape=shape, window=window, compiled=compiled, device_type=device_type, cache_len=cache_len,
        kv_per_slot=kv, activations_per_slot=window_act, prefill_activations=activation_bytes(shape, shape.prompt_len,
                                                                                              shape.prompt_len),
        compile_per_slot=graphs, gumbel_per_slot=shape.body_len * shape.image_vocab * 4 if gumbel else 0,
        reserve=int(CUDA_RESERVE_GB * GB) if device_type == "cuda" else 0, mask_table=cache_len**2 * shape.dtype_bytes,
    )


def describe_plan(plan: MemoryPlan, memory_bytes: float, memory_source: str) -> str:
    """The plan's numbers, one per line, and the batch that fits ``memory_bytes``."""
    s = plan.shape
    fit = plan.max_batch(memory_bytes)
    lines = [
        f"memory plan: model={s.name} ({s.source}), window {plan.window}, "
        f"{'compiled' if plan.compiled else 'eager'}, {plan.device_type}",
        f"  weights                {gb(s.weight_bytes):>9} GB",
        f"  KV cache per image     {gb(plan.kv_per_slot):>9} GB  = {s.cfg_rows} CFG rows x {plan.cache_len} entries x "
        f"{s.layers} layers x {s.kv_heads} KV heads x {s.head_dim} head dim x 2 x {s.dtype_bytes} B",
        f"  activations per image  {gb(plan.activations_per_slot):>9} GB  (window forward; prefill of one image: "
        f"{gb(plan.prefill_activations)} GB)",
        f"  causal-mask table      {gb(plan.mask_table):>9} GB  = {plan.cache_len}^2 x {s.dtype_bytes} B, once",
        f"  compile workspace      {gb(plan.compile_per_slot):>9} GB per image + reserve {gb(plan.reserve)} GB",
        *([f"  Gumbel noise per image {gb(plan.gumbel_per_slot):>9} GB"] if plan.gumbel_per_slot else []),
        f"  memory                 {gb(memory_bytes):>9} GB  ({memory_source})",
        f"  largest engine.batch_size that fits: {fit}" + ("" if fit else " (not even one image: the model does not fit)"),
    ]
    return "\n".join(lines)


def plan_table(models: list[DictConfig], window: int, compiled: bool, sizes: tuple[int, ...] = TABLE_GB) -> str:
    """Markdown table: each model's weights, per-image bytes and the batch that fits each device size (GB, CUDA)."""
    head = "| model | weights GB | KV / image GB | activations / image GB | " + " | ".join(f"B @ {g} GB" for g in sizes)
    lines = [head + " |", "|---" * (4 + len(sizes)) + "|"]
    for model in models:
        plan = plan_memory(model_shape(model), window, compiled, "cuda")
        fits = " | ".join(str(b) if (b := plan.max_batch(g * GB)) < MAX_BATCH else f">= {MAX_BATCH}" for g in sizes)
        lines.append(f"| {model.name} | {gb(plan.shape.weight_bytes)} | {gb(plan.kv_per_slot)} | "
                     f"{gb(plan.activations_per_slot)} | {fits} |")
    return "\n".join(lines)


def config_plan(cfg: DictConfig) -> tuple[MemoryPlan, float, str]:
    """The plan of a run's config, its memory budget in bytes and where that number comes from."""
    from csd.compose import build_drafter
    from csd.device import resolve_device

    device = resolve_device(cfg.device)
    gumbel = cfg.drafter.get("coupling") == "gumbel"
    shape = model_shape(cfg.model)
    window = build_drafter(cfg.drafter).forward_entries(shape.grid, shape.body_len)
    plan = plan_memory(shape, window, cfg.engine.compile, device.type, gumbel)
    if cfg.engine.memory_gb is not None:
        return plan, cfg.engine.memory_gb * GB, "engine.memory_gb"
    what = "free memory of " + str(device) if device.type == "cuda" else "available RAM"
    return plan, available_memory(device), what


def resolve_batch_size(cfg: DictConfig) -> None:
    """``engine.batch_size=auto``: set it to the plan's largest batch (at least 1), at most the run's images
    (:func:`run_images`), logged; ints stay."""
    import logging

    from csd.errors import ConfigError

    if cfg.engine.batch_size != "auto":
        return
    plan, memory, source = config_plan(cfg)
    batch = plan.max_batch(memory)
    if batch < 1:
        raise ConfigError(f"engine.batch_size=auto: model={cfg.model.name} needs {gb(plan.total(1))} GB for one image, "
                          f"more than the {gb(memory)} GB of {source}")
    images = run_images(cfg)
    capped = images is not None and batch > images
    batch = min(batch, images) if images is not None else batch
    logging.getLogger("csd").info("engine.batch_size=auto -> %d (%s GB planned of %s GB, %s%s)", batch,
                                  gb(plan.total(batch)), gb(memory), source,
                                  f"; capped at the run's {images} images" if capped else "")
    cfg.engine.batch_size = batch


def run_images(cfg: DictConfig) -> int | None:
    """The images a run asks for, ``dataset.n_prompts x dataset.samples_per_prompt`` (None when the prompt count is
    the whole set's, unknown before it is read): more slots than that would never fill."""
    prompts = OmegaConf.select(cfg, "dataset.n_prompts", default=None)
    samples = OmegaConf.select(cfg, "dataset.samples_per_prompt", default=1)
    return prompts * samples if isinstance(prompts, int) and isinstance(samples, int) else None


def preset_configs() -> list[DictConfig]:
    """Every ``conf/model/`` preset."""
    from csd.presets import CONF_DIR

    return [OmegaConf.load(p) for p in sorted((CONF_DIR / "model").glob("*.yaml"))]


def main() -> None:
    """``python -m csd.plan``: the table of every preset (SJD's window 16 and 32, eager and compiled) on CUDA sizes."""
    models = preset_configs()
    for window, compiled in ((16, False), (16, True), (32, True)):
        print(f"\n### window {window}, {'compiled' if compiled else 'eager'}\n")
        print(plan_table(models, window, compiled))


if __name__ == "__main__":
    main()
