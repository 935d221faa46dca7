"""Prompt sets. A dataset config names a loader (``_target_``) that returns a list of :class:`Prompt`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One caption to generate from. ``prompt_id`` is stable across runs (resume and FID pairing use it)."""

    prompt_id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)


SMOKE_CAPTIONS = (
    "a red apple on a wooden table",
    "a lighthouse on a cliff at sunset",
    "two cats sleeping on a blue sofa",
    "a bowl of ramen with chopsticks",
    "a snowy mountain above a green valley",
    "an astronaut riding a horse",
)


def smoke_prompts(n_prompts: int | None = None) -> list[Prompt]:
    """A handful of built-in captions for smoke runs (no files needed)."""
    captions = SMOKE_CAPTIONS if n_prompts is None else SMOKE_CAPTIONS[:n_prompts]
    return [Prompt(f"smoke-{i:03d}", c) for i, c in enumerate(captions)]
