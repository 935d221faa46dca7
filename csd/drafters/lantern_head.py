"""LANTERN's released EAGLE drafters as ``drafter=eagle`` heads (docs/DRAFT_HEADS.md, "LANTERN's drafters on
LlamaGen").

LANTERN (arXiv 2410.03355, repository jadohu/LANTERN) publishes EAGLE-1 drafters for LlamaGen as a folder with a
``config.json`` (Llama sizes plus ``input_type``: ``t2i`` / ``t2i2`` / ``c2i``, optionally ``bias``) and the weights
in ``pytorch_model.bin`` or ``model.safetensors``. The drafter is the head of ``csd.drafters.eagle``: ``fc`` over
``[e(x); f]`` (with a bias unless ``bias`` is false), one decoder layer without its input norm, no final norm, the
target's output head. Its state dict names:

* ``fc.weight``, ``fc.bias`` -> ``fc.*``; ``layers.0.{self_attn,mlp,post_attention_layernorm}.*`` -> ``layer.*``;
* ``embed_tokens.weight``: a frozen copy of the target's input embedding; the head embeds with the target's own
  table (``adapter.embed``), so the copy is checked for shape and dropped.

Its cache opens with the prompt: LANTERN feeds the drafter the target's features of every prompt position, each
paired with the next input id, and the prompt's ids are zeros, so an image's first ``cls_token_num - 1`` pairs are
(code 0, the target's feature of prompt position ``p``) (none for ``c2i``), then ``(x_0, f)`` of the last prompt
position and the image's pairs (``EagleDrafter.start`` computes them: one target pass over the prompt per image).
Its attention turns queries and keys by LlamaGen's 2-D rotary (pairs ``(2i, 2i+1)``, the first half of the pairs by
the grid row, the others by the column, base 10000): zero at the condition pairs, the grid cell of the pair's token
after them. The transformers layer turns the halves ``(i, i + d/2)`` instead, so the loader reorders each head's query
and key rows (even channels, then odd) and gives the head a :class:`GridRotary`: the same scores, exactly.

LANTERN's Anole drafter (``jadohu/anole_drafter``; ``models/drafters/cnets_anole.py``, ``models/ea_model_anole.py``)
has a Chameleon ``config.json`` (``model_type: chameleon``, no ``input_type``) and Chameleon's decoder layer: its input
RMSNorm kept, per-head LayerNorms of queries and keys (``q_norm`` / ``k_norm``, weight and bias), 1-D rotary of base
``rope_theta`` in the half layout; ``fc`` with a bias unless ``bias`` is false, no final norm, the target's output
head. Its keys map strictly as the LlamaGen drafters' do (``layers.0.*`` -> ``layer.*``, the embedding copy checked
and dropped) onto an :class:`AnoleLayer` (transformers' Chameleon layer). Its cache opens with the whole prompt of
each CFG row: the target's feature of every prompt position ``t`` but the last, paired with the prompt's next id, at
the target's position id ``t`` (docs/DRAFT_HEADS.md, "LANTERN's Anole drafter"); then ``(x_0, f)`` of the last
prompt position and the image's pairs, as for any head.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import ChameleonConfig
from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer, ChameleonRotaryEmbedding

from csd.adapters.anole import AnoleAdapter
from csd.adapters.base import ModelAdapter
from csd.adapters.llamagen import LlamaGenAdapter
from csd.adapters.llamagen_gpt import LlamaGenConfig, rotary_angles
from csd.hub import download_command

#: the weight files of a LANTERN drafter folder, in the order its loader tries them
LANTERN_WEIGHTS = ("pytorch_model.bin", "model.safetensors")
#: LANTERN's released drafters (model card names), by the target they were trained on
LANTERN_REPOS = {"model=llamagen_t2i_256": "jadohu/llamagen_drafter", "model=llamagen_t2i": "jadohu/llamagen2_drafter",
                 "model=anole_7b": "jadohu/anole_drafter"}
#: the rotary base LANTERN's drafter fixes for every input type
LANTERN_ROPE_BASE = 10000.0
#: LANTERN's ``input_type`` -> the LlamaGen ``model_type`` and grid side it drafts for (its code fixes the grid:
#: 256, 1024 and 576 image tokens)
INPUT_TYPES = {"t2i": ("t2i", 16), "t2i2": ("t2i", 32), "c2i": ("c2i", 24)}
#: the layer's weights, under the layer's prefix (``layers.0.`` there, ``layer.`` here)
LAYER_KEYS = tuple(f"self_attn.{p}_proj.weight" for p in "qkvo") + tuple(
    f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")) + ("post_attention_layernorm.weight",)
#: kept in LANTERN's file, taken from the target here
TARGET_COPY = "embed_tokens.weight"
#: LANTERN's drafter kinds (told apart by ``config.json``: :func:`lantern_kind`): the adapter each drafts for, its
#: name and the models
LANTERN_KINDS = {"llamagen": (LlamaGenAdapter, "a LANTERN LlamaGen drafter", "model=llamagen_*"),
                 "anole": (AnoleAdapter, "LANTERN's Anole drafter (model_type chameleon)", "model=anole_7b / anole_tiny")}
#: the Anole drafter's sizes that must be the target's (its attention and its copy of the input embedding)
ANOLE_FIT = ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
#: the Anole drafter's ``config.json`` keys the layer is built from, with LANTERN's defaults (None: required)
ANOLE_LAYER = {"hidden_size": None, "intermediate_size": None, "num_attention_heads": None, "num_key_value_heads": None,
               "rms_norm_eps": None, "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False,
               "mlp_bias": False}


@dataclass(frozen=True)
class HeadParts:
    """What ``csd.drafters.eagle.load_head`` builds an ``EagleHead`` from: ``state`` in its names, the rotary, the
    prompt pairs that open an image's cache, and either the Llama layer's ``sizes`` (``HEAD_SIZES``) or a ``layer``
    of another kind (which carries its ``config``)."""

    state: dict[str, torch.Tensor]
    rotary: nn.Module
    pairs: PromptPairs
    sizes: dict[str, Any] | None = None
    layer: AnoleLayer | None = None


class PromptPairs(ABC):
    """The pairs ``(id, target feature)`` an image's head cache opens with, per CFG row (conditional first): one
    target pass over the prompt, no cache. ``count``: how many per row, when every prompt has the same number."""

    count: int | None = None

    @abstractmethod
    def __call__(self, adapter: ModelAdapter, prompt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per CFG row: ids ``[k_r]`` and the target's features ``[k_r, D]``, in cache order."""


class ConditionPairs(PromptPairs):
    """LlamaGen (module docstring): ``(code 0, f_p)`` for the first ``count`` prompt positions ``p`` of every row."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __call__(self, adapter: ModelAdapter, prompt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        features = adapter.features_step(adapter.prompt_inputs(prompt), None)[:, : self.count]
        ids = adapter.image_token_ids[0].to(features.device).repeat(self.count)
        return [(ids, f) for f in features]


class PromptTokenPairs(PromptPairs):
    """Anole (module docstring): ``(prompt[t + 1], f_t)`` for ``t = 0 .. T_r - 2`` of each row's own prompt, so the
    pair of position ``t`` sits at cache index = position id ``t`` (the head's cache rows, as the target's, hold each
    row from index 0)."""

    def __call__(self, adapter: ModelAdapter, prompt: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        rows = adapter.prompt_inputs(prompt)
        return [(row[1:], adapter.features_step(row[None], None, None, None)[0, :-1]) for row in rows]


class AnoleLayer(ChameleonDecoderLayer):
    """Chameleon's decoder layer (LANTERN's Anole drafter: input RMSNorm, per-head q / k LayerNorms), returning the
    hidden states alone as ``EagleHead``'s Llama layer does; ``config``: its transformers config (the cache's sizes)."""

    def __init__(self, config: ChameleonConfig) -> None:
        super().__init__(config, layer_idx=0)
        self.config = config

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return super().forward(hidden_states, **kwargs)[0]


def is_lantern(path: str | Path) -> bool:
    """Whether ``drafter.head`` names a LANTERN drafter: a folder, or one of its weight files."""
    return Path(path).is_dir() or Path(path).name in LANTERN_WEIGHTS


def lantern_files(path: str | Path) -> tuple[Path, Path]:
    """The drafter's ``config.json`` and weight file; one line with the download command if either is missing."""
    root = Path(path) if Path(path).is_dir() else Path(path).parent
    weights = [root / name for name in LANTERN_WEIGHTS if (root / name).is_file()]
    if not (root / "config.json").is_file() or not weights:
        hints = "; ".join(f"{model}: `{download_command(repo)}`" for model, repo in LANTERN_REPOS.items())
        raise ValueError(f"drafter.head={path}: a LANTERN drafter folder holds config.json and "
                         f"{' or '.join(LANTERN_WEIGHTS)}, not found there; get one ({hints})")
    return root / "config.json", Path(path) if Path(path).is_file() else weights[0]


class GridRotary(nn.Module):
    """LlamaGen's 2-D rotary at head position ``p``: zero at the ``cls_token_num - 1`` condition pairs, then grid
    cell ``p - cls_token_num + 1`` (``rotary_angles`` of the target's config, one condition position less), laid out
    for transformers' half rotation: ``cos, sin [N, q, d]``, each angle on channels ``i`` and ``i + d/2``."""

    def __init__(self, config: LlamaGenConfig) -> None:
        super().__init__()
        self.config = dataclasses.replace(config, cls_token_num=config.cls_token_num - 1, rope_base=LANTERN_ROPE_BASE)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rotary_angles(self.config, position_ids)
        return torch.cat([cos, cos], dim=-1).to(x.dtype), torch.cat([sin, sin], dim=-1).to(x.dtype)


def halves_from_pairs(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """``[heads * d, D]`` projection rows reordered per head from pair order to half order: channels ``0, 2, ..,
    d - 2`` then ``1, 3, .., d - 1`` (so the pair ``(2i, 2i+1)`` becomes the halves' ``(i, i + d/2)``)."""
    return weight.unflatten(0, (heads, -1, 2)).transpose(1, 2).flatten(0, 2)


def lantern_kind(path: str | Path) -> str:
    """``llamagen`` (``config.json`` has an ``input_type``) or ``anole`` (``model_type: chameleon``); one line for
    any other config (or missing files)."""
    config_file = lantern_files(path)[0]
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"drafter.head={path}: {config_file} is not JSON ({err})") from None
    if "input_type" in config:
        return "llamagen"
    if config.get("model_type") == "chameleon":
        return "anole"
    raise ValueError(f"drafter.head={path}: its config.json has neither input_type (LANTERN's LlamaGen drafters: "
                     f"{sorted(INPUT_TYPES)}) nor model_type 'chameleon' (its Anole drafter)")


def target_problem(path: str | Path, adapter_class: type[ModelAdapter]) -> str | None:
    """One line if LANTERN's drafter at ``path`` does not draft for ``adapter_class`` (known before weights load)."""
    cls, what, models = LANTERN_KINDS[lantern_kind(path)]
    return None if issubclass(adapter_class, cls) else (f"drafter.head={path} is {what}; it drafts for {models}, not "
                                                         f"{adapter_class.__name__}")


def fits_class(path: str | Path, adapter: ModelAdapter) -> None:
    """:func:`target_problem` of ``adapter``'s class, raised."""
    problem = target_problem(path, type(adapter))
    if problem is not None:
        raise ValueError(problem)


def check_fit(path: str | Path, config: dict[str, Any], adapter: ModelAdapter) -> LlamaGenConfig:
    """The target's LlamaGen config, after one line if the drafter was not made for this target."""
    fits_class(path, adapter)
    target = adapter.decoder().config
    kind = config.get("input_type")
    if INPUT_TYPES.get(kind) != (target.model_type, target.grid):
        raise ValueError(f"drafter.head={path}: input_type={kind!r} drafts for (kind, grid) = {INPUT_TYPES.get(kind)}"
                         f", the target is ({target.model_type!r}, {target.grid}); allowed: {INPUT_TYPES}")
    ours = (config.get("hidden_size"), config.get("num_attention_heads"), config.get("vocab_size"))
    theirs = (target.hidden_size, target.num_attention_heads, adapter.vocab_size)
    if ours != theirs:
        raise ValueError(f"drafter.head={path}: the drafter has (hidden size, heads, vocab) = {ours}, the target "
                         f"{theirs}")
    return target


def read_weights(weights: Path) -> dict[str, torch.Tensor]:
    """A drafter's state dict from ``pytorch_model.bin`` or ``model.safetensors``."""
    return (load_file(weights) if weights.suffix == ".safetensors"
            else torch.load(weights, map_location="cpu", weights_only=True))


def strict_keys(path: str | Path, raw: dict[str, torch.Tensor], layer_keys: Any, bias: bool) -> None:
    """One line unless ``raw`` holds exactly ``fc`` (its bias when ``bias``), the embedding copy and ``layers.0.``
    + ``layer_keys``."""
    wanted = {"fc.weight", TARGET_COPY, *(["fc.bias"] if bias else []), *(f"layers.0.{k}" for k in layer_keys)}
    if set(raw) != wanted:
        raise ValueError(f"drafter.head={path}: missing keys {sorted(wanted - set(raw))}, unexpected keys "
                         f"{sorted(set(raw) - wanted)} for a LANTERN drafter (config bias={bias})")


def head_state(path: str | Path, raw: dict[str, torch.Tensor], layer_keys: Any, bias: bool,
               embedding: tuple[int, int]) -> dict[str, torch.Tensor]:
    """``EagleHead``'s state dict (fp32) from LANTERN's ``raw`` (module docstring: the names), after one line for a
    wrong key set or an embedding copy not of the target's input embedding's shape ``embedding``."""
    strict_keys(path, raw, layer_keys, bias)
    if tuple(raw[TARGET_COPY].shape) != embedding:
        raise ValueError(f"drafter.head={path}: {TARGET_COPY} is {tuple(raw[TARGET_COPY].shape)}, the target's input "
                         f"embedding is {embedding}")
    state = {f"layer.{k}": raw[f"layers.0.{k}"] for k in layer_keys}
    state["fc.weight"] = raw["fc.weight"]
    state["fc.bias"] = raw["fc.bias"] if bias else torch.zeros(raw["fc.weight"].shape[0])  # no bias: a zero one
    return {k: v.float() for k, v in state.items()}


def lantern_parts(path: str | Path, adapter: ModelAdapter) -> HeadParts:
    """The head LANTERN's drafter at ``path`` makes for ``adapter``: a LlamaGen drafter (``input_type``) or the Anole
    drafter (``model_type: chameleon``), told apart by its ``config.json``; one line for any other."""
    parts = llamagen_parts if lantern_kind(path) == "llamagen" else anole_parts
    config_file, weights = lantern_files(path)
    return parts(path, json.loads(config_file.read_text()), weights, adapter)


def llamagen_parts(path: str | Path, config: dict[str, Any], weights: Path, adapter: ModelAdapter) -> HeadParts:
    """A LlamaGen drafter's head (module docstring: the names, the query / key reordering, the condition pairs)."""
    target = check_fit(path, config, adapter)
    bias = config.get("bias", True)
    state = head_state(path, read_weights(weights), LAYER_KEYS, bias, (adapter.vocab_size, target.hidden_size))
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    state["layer.self_attn.q_proj.weight"] = halves_from_pairs(state["layer.self_attn.q_proj.weight"], heads)
    state["layer.self_attn.k_proj.weight"] = halves_from_pairs(state["layer.self_attn.k_proj.weight"], kv)
    sizes = {"hidden_size": config["hidden_size"], "intermediate_size": config["intermediate_size"],
             "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": config["hidden_size"] // heads,
             "rms_norm_eps": config["rms_norm_eps"]}
    rotary = GridRotary(target)
    return HeadParts(state, rotary, ConditionPairs(rotary.config.cls_token_num), sizes=sizes)


def anole_fit(path: str | Path, config: dict[str, Any], adapter: ModelAdapter) -> ChameleonConfig:
    """The Anole drafter's layer config, after one line if ``adapter`` is not Anole, if its attention or vocabulary
    sizes are not the target's, if a layer key is missing or if it scales its rotary (LANTERN's default is none)."""
    fits_class(path, adapter)
    target = adapter.decoder().config
    ours, theirs = tuple(config.get(k) for k in ANOLE_FIT), tuple(getattr(target, k) for k in ANOLE_FIT)
    if ours != theirs:
        raise ValueError(f"drafter.head={path}: the drafter has (hidden size, heads, key-value heads, vocab) = {ours}, "
                         f"the target {theirs}")
    missing = [k for k, default in ANOLE_LAYER.items() if default is None and k not in config]
    if missing or config.get("rope_scaling") is not None:
        raise ValueError(f"drafter.head={path}: config.json lacks {missing} or sets rope_scaling="
                         f"{config.get('rope_scaling')!r}; LANTERN's Anole drafter has them all and rope_scaling null")
    sizes = {k: config.get(k, default) for k, default in ANOLE_LAYER.items()}
    return ChameleonConfig(**sizes, num_hidden_layers=1, vocab_size=1, bos_token_id=None, eos_token_id=None,
                           pad_token_id=None, attn_implementation="sdpa")


def anole_parts(path: str | Path, config: dict[str, Any], weights: Path, adapter: ModelAdapter) -> HeadParts:
    """The Anole drafter's head (module docstring): Chameleon's layer, 1-D rotary, each row's prompt pairs."""
    layer = AnoleLayer(anole_fit(path, config, adapter))
    target = adapter.decoder().config
    state = head_state(path, read_weights(weights), tuple(layer.state_dict()), config.get("bias", True),
                       (target.vocab_size, target.hidden_size))
    return HeadParts(state, ChameleonRotaryEmbedding(layer.config), PromptTokenPairs(), layer=layer)
