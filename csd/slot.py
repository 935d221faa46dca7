"""An image in flight: the request to decode and its decoding state in a batch slot (:class:`Slot`), which the engine
(``csd.engine``) advances and each drafter (``csd.drafters``) reads and extends with its own state (``Slot.draft``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from csd.device import Span


@dataclass(frozen=True)
class Request:
    """One image to decode; ``key`` is the caller's handle, returned with the result."""

    prompt: str
    seed: int
    key: Any = None


@dataclass
class Slot:
    """Decoding state of the image in a batch slot (host ints, device tensors); ``draft``: the drafter's state."""

    request: Request
    generator: torch.Generator
    body: torch.Tensor
    commit_iter: torch.Tensor
    commit_kind: torch.Tensor
    entropy: torch.Tensor
    stats: torch.Tensor
    times: list[float] = field(default_factory=list)
    #: batch 1: the device time of each iteration's propose and refresh steps (read when the image finishes)
    drafter_spans: list[Span] = field(default_factory=list)
    draft: Any = None
    n: int = 0
    iteration: int = 0
