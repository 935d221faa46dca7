"""Logits -> target distribution ``q``: the one processing pipeline shared by AR and every method.

docs/ALGORITHMS.md, "Notation": ``q`` is the model's logits after the image-token mask, CFG, the optional
dynamic (entropy) temperature, top-k and temperature, then softmax. Every acceptance rule sees this
processed distribution, and AR samples from exactly the same ``q``. Each processor is a small function
of a tensor, in the spirit of transformers' ``LogitsProcessor`` list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from csd.acceptance import entropy
from csd.adapters.base import EntropyTemperature, SamplingConfig

Processor = Callable[[torch.Tensor], torch.Tensor]


def select_columns(columns: torch.Tensor) -> Processor:
    """Image-token mask: keep only the image-code columns of full-vocabulary logits."""

    def apply(logits: torch.Tensor) -> torch.Tensor:
        return logits.index_select(-1, columns)

    return apply


def classifier_free_guidance(scale: float) -> Processor:
    """``l = l_u + s (l_c - l_u)`` over rows ``[..., cond/uncond, K, V]`` -> ``[..., K, V]``.

    Combining log-softmax values instead (Emu3's convention) gives the same ``q``: log-softmax shifts
    each row by a constant ``c``, and ``(l_u - c_u) + s ((l_c - c_c) - (l_u - c_u))`` differs from the
    above by the constant ``c_u + s (c_c - c_u)``, which the softmax (and top-k) ignore.
    """

    def apply(logits: torch.Tensor) -> torch.Tensor:
        cond, uncond = logits[..., 0, :, :], logits[..., 1, :, :]
        return uncond + scale * (cond - uncond)

    return apply


def single_row(logits: torch.Tensor) -> torch.Tensor:
    """No CFG: the only row of ``[..., 1, K, V]``."""
    return logits[..., 0, :, :]


def entropy_temperature(params: EntropyTemperature) -> Processor:
    """ARsample's dynamic temperature (docs/ALGORITHMS.md "The target q", released Lumina-mGPT code):
    per row, ``H`` = entropy in nats of the softmax of the logits it receives (image columns after CFG, before
    top-k, as in the code), ``T = clamp(t0 exp(-H / alpha) + theta, lo, hi)``, then ``logits / T``.

    Dividing by ``T > 0`` keeps the order of the logits, so the top-k that follows keeps the same tokens.
    """

    def apply(logits: torch.Tensor) -> torch.Tensor:
        h = entropy(torch.softmax(logits, dim=-1))
        t = (params.t0 * torch.exp(-h / params.alpha) + params.theta).clamp(params.lo, params.hi)
        return logits / t.unsqueeze(-1)

    return apply


def top_k(k: int) -> Processor:
    """Keep the ``k`` largest logits per position (ties at the k-th value are kept)."""

    def apply(logits: torch.Tensor) -> torch.Tensor:
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth, float("-inf"))

    return apply


def temperature(t: float) -> Processor:
    def apply(logits: torch.Tensor) -> torch.Tensor:
        return logits / t

    return apply


class TargetPipeline:
    """Raw adapter logits ``[(B,) rows, K, V_raw]`` -> target probabilities ``[(B,) K, V]`` (float32)."""

    def __init__(self, processors: Sequence[Processor]) -> None:
        self.processors = list(processors)

    @classmethod
    def build(cls, sampling: SamplingConfig, raw_image_columns: torch.Tensor | None = None) -> TargetPipeline:
        procs: list[Processor] = []
        if raw_image_columns is not None:
            procs.append(select_columns(raw_image_columns))
        if sampling.guidance_scale != 1.0:
            procs.append(classifier_free_guidance(sampling.guidance_scale))
        else:
            procs.append(single_row)
        if sampling.entropy_temperature is not None:
            procs.append(entropy_temperature(sampling.entropy_temperature))
        if sampling.top_k > 0:
            procs.append(top_k(sampling.top_k))
        if sampling.temperature != 1.0:
            procs.append(temperature(sampling.temperature))
        return cls(procs)

    def __call__(self, raw_logits: torch.Tensor) -> torch.Tensor:
        logits = raw_logits.float()
        for proc in self.processors:
            logits = proc(logits)
        return torch.softmax(logits, dim=-1)
