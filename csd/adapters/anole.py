"""Anole-7B on ``transformers.ChameleonForConditionalGeneration`` (docs/MODELS.md, "Anole-7B").

Anole is Chameleon-7B with its image-token rows of the output head fine-tuned for image generation (GAIR-NLP/anole,
README "Methodology"): the architecture, tokenizer, ``bpe2img`` token mapping and VQGAN are Chameleon's, shared with
Lumina-mGPT through :class:`csd.adapters.lumina.ChameleonAdapter` and :func:`csd.adapters.lumina.load_chameleon`.
What differs is the image format (GAIR-NLP/anole ``chameleon/inference/chameleon.py``, which jadohu/LANTERN's
``models/ea_model_anole.py`` reproduces):

* Prompt: BOS, the caption, ``<reserved08706>`` (end of turn, id 8710), ``<racm3:break>`` (begin image, id 8197).
* Body: 32 x 32 = 1024 image tokens in raster order at 512 px (Meta's decoder reshapes them to 32 x 32): no
  header, no end-of-line tokens, nothing forced. The end-of-image token ``<eoss>`` (8196) follows the 1024th token
  without a model call in Anole's decoder (LANTERN stops after 1024 tokens), so it is no body position.
* CFG (scale 3, on raw logits): the unconditional prompt is BOS, ``<racm3:break>`` (positions 0 and 1), Anole's
  ``unconditioned`` row; both rows decode at their own prompt lengths on one ``csd.cache.RaggedCache``.
* Pixels: Meta's VQGAN decoder (``csd.adapters.vqgan``), uint8 truncated as Meta's ``image_tokenizer.py`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from csd.adapters.base import BodyLayout, checks_weights
from csd.adapters.lumina import (
    ChameleonAdapter,
    check_chameleon_files,
    load_chameleon_adapter,
    tiny_chameleon_adapter,
)
from csd.adapters.shapes import ANOLE_HUB_SHAPES

#: Anole's image grid: 1024 tokens decoded as 32 x 32 (GAIR-NLP/anole ``chameleon/inference/image_tokenizer.py``)
ANOLE_GRID = (32, 32)
#: the HF-format checkpoint SJD and LANTERN load (a conversion of ``GAIR/Anole-7b-v0.1``, which is Meta's format)
ANOLE_HUB = "leloy/Anole-7b-v0.1-hf"
#: GAIR/Anole-7b-v0.1 ships Meta's tokenizer files under ``tokenizer/`` (GAIR-NLP/anole ``constants.py``)
ANOLE_VQGAN_SOURCE = (
    "Download them with `hf download GAIR/Anole-7b-v0.1 --include 'tokenizer/*' --local-dir <dir>` and set "
    "model.vqgan_config=<dir>/tokenizer/vqgan.yaml model.vqgan_ckpt=<dir>/tokenizer/vqgan.ckpt."
)
#: load_chameleon_adapter's names of Anole: the family, its hub repository, where its VQGAN files come from
ANOLE_NAMES = ("Anole", ANOLE_HUB, ANOLE_VQGAN_SOURCE)


def anole_layout(rows: int, cols: int, jacobi_tail: int) -> BodyLayout:
    """``rows`` x ``cols`` free image tokens in raster order, nothing forced."""
    return BodyLayout.from_forced(torch.full((rows * cols,), -1, dtype=torch.long), (rows, cols), jacobi_tail)


class AnoleAdapter(ChameleonAdapter):
    """Anole's prompt rows and raster body on the shared Chameleon adapter."""

    def body_layout(self, jacobi_tail: int) -> BodyLayout:
        return anole_layout(self.rows, self.cols, jacobi_tail)

    def prompt_rows(self, prompt: str) -> list[torch.Tensor]:
        t = self.tokens
        cond = torch.cat([torch.tensor([t.bos]), self.encode(prompt), torch.tensor([t.end_of_turn, t.image_start])])
        return [cond, torch.tensor([t.bos, t.image_start])] if self.uses_cfg else [cond]

    def body_codes(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bpe_to_code[ids.view(-1, self.rows, self.cols)]


def check_anole_files(path: str, vqgan_config: str, vqgan_ckpt: str, random_init: bool = False,
                      layers: int | None = None, **_: object) -> None:
    """:func:`load_anole_adapter`'s weights check (``csd.adapters.base.checks_weights``)."""
    check_chameleon_files(path, vqgan_config, vqgan_ckpt, ANOLE_NAMES, ANOLE_HUB_SHAPES, random_init, layers)


@checks_weights(check_anole_files)
def load_anole_adapter(path: str, vqgan_config: str, vqgan_ckpt: str, **params: Any) -> AnoleAdapter:
    """Anole-7B (``leloy/Anole-7b-v0.1-hf``) plus Meta's VQGAN decoder (from ``GAIR/Anole-7b-v0.1``), 512 px; the
    other keys are ``csd.adapters.lumina.load_chameleon_adapter``'s (CFG 3, top-k 2000, temperature 1, bf16, no
    plain-AR tail by default)."""
    return load_chameleon_adapter(AnoleAdapter, path, vqgan_config, vqgan_ckpt, lambda _: ANOLE_GRID, ANOLE_NAMES,
                                  ANOLE_HUB_SHAPES, **params)


def tiny_anole_adapter(**params: Any) -> AnoleAdapter:
    """A seeded random tiny Anole (``csd.adapters.lumina.tiny_chameleon_adapter``'s keys and model, byte-level
    prompts) for smoke runs and tests."""
    return tiny_chameleon_adapter(AnoleAdapter, **params)
