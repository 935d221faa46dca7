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
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from csd.adapters.base import ModelAdapter
from csd.adapters.llamagen_gpt import LlamaGenConfig, rotary_angles
from csd.hub import download_command

#: the weight files of a LANTERN drafter folder, in the order its loader tries them
LANTERN_WEIGHTS = ("pytorch_model.bin", "model.safetensors")
#: LANTERN's released LlamaGen drafters (model card names), by the target they were trained on
LANTERN_REPOS = {"model=llamagen_t2i_256": "jadohu/llamagen_drafter", "model=llamagen_t2i": "jadohu/llamagen2_drafter"}
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


def check_fit(path: str | Path, config: dict[str, Any], adapter: ModelAdapter) -> LlamaGenConfig:
    """The target's LlamaGen config, after one line if the drafter was not made for this target."""
    target = adapter.decoder().config
    if not isinstance(target, LlamaGenConfig):
        raise ValueError(f"drafter.head={path} is a LANTERN LlamaGen drafter; it drafts for model=llamagen_*, not "
                         f"{type(adapter).__name__}")
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


def lantern_layer(path: str | Path, adapter: ModelAdapter) -> tuple[dict[str, Any], dict[str, torch.Tensor],
                                                                      GridRotary]:
    """The head sizes (``csd.drafters.eagle.HEAD_SIZES``), its state dict in ``EagleHead``'s names and its rotary,
    from the LANTERN drafter at ``path``; one line for a drafter that does not fit ``adapter`` or a missing /
    unexpected key (module docstring: the names, the dropped embedding copy, the query / key reordering)."""
    config_file, weights = lantern_files(path)
    config = json.loads(config_file.read_text())
    target = check_fit(path, config, adapter)
    raw = (load_file(weights) if weights.suffix == ".safetensors"
           else torch.load(weights, map_location="cpu", weights_only=True))
    bias = config.get("bias", True)
    wanted = {"fc.weight", TARGET_COPY, *(["fc.bias"] if bias else []), *(f"layers.0.{k}" for k in LAYER_KEYS)}
    if set(raw) != wanted:
        raise ValueError(f"drafter.head={path}: missing keys {sorted(wanted - set(raw))}, unexpected keys "
                         f"{sorted(set(raw) - wanted)} for a LANTERN drafter (config bias={bias})")
    embed = tuple(raw[TARGET_COPY].shape)
    if embed != (adapter.vocab_size, target.hidden_size):
        raise ValueError(f"drafter.head={path}: {TARGET_COPY} is {embed}, the target's input embedding is "
                         f"{(adapter.vocab_size, target.hidden_size)}")
    state = {f"layer.{k}": raw[f"layers.0.{k}"] for k in LAYER_KEYS}
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    state["layer.self_attn.q_proj.weight"] = halves_from_pairs(state["layer.self_attn.q_proj.weight"], heads)
    state["layer.self_attn.k_proj.weight"] = halves_from_pairs(state["layer.self_attn.k_proj.weight"], kv)
    state["fc.weight"] = raw["fc.weight"]
    state["fc.bias"] = raw["fc.bias"] if bias else torch.zeros(raw["fc.weight"].shape[0])  # no bias: a zero one
    sizes = {"hidden_size": config["hidden_size"], "intermediate_size": config["intermediate_size"],
             "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": config["hidden_size"] // heads,
             "rms_norm_eps": config["rms_norm_eps"]}
    return sizes, {k: v.float() for k, v in state.items()}, GridRotary(target)
