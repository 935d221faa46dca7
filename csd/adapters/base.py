"""The model adapter interface: everything the decoding engine needs from a target model.

The engine (``csd.engine``) knows nothing about Janus, Lumina-mGPT or the toy model; an adapter knows
nothing about acceptance rules. The contract, in the vocabulary of docs/ALGORITHMS.md:

* The image is a **body** of ``layout.length`` positions. A position is either *free* (its token is
  sampled from the image vocabulary of ``vocab_size`` codes) or *forced* (a deterministic structural
  token such as Lumina-mGPT's end-of-line; ``layout.forced_ids[n] >= 0``).
* The engine holds body tokens as **token ids in the adapter's space**; index ``v`` of a target
  distribution corresponds to id ``image_token_ids[v]``.
* ``prefill`` feeds every prompt token *except the last* into a fresh cache and returns an opaque
  context. The last prompt token is the first window's anchor: ``forward(ctx, ids, with_prompt_tail=True)``
  prepends it, so row ``j`` of a window always predicts the token after window element ``j``.
* ``forward`` returns **raw** logits ``[rows, K, V_raw]`` (rows = 2 with CFG: conditional first, then
  unconditional). Turning them into the target distribution ``q`` is the shared processor pipeline's
  job (``csd.processors``), built from ``sampling``.
* ``rollback(ctx, n)`` removes the last ``n`` cache entries (the rejected part of a window).
* Batches: the engine decodes ``B`` images at once through ``start_batch`` / ``prefill_slot`` /
  ``forward_batch`` / ``rollback_batch`` (a slot holds one image and its CFG rows). The defaults here
  loop over one single-image context per slot (correct for every adapter, one forward per slot);
  adapters with a batched cache override them so that one forward carries every slot.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from csd.tree import TreeMask


@dataclass(frozen=True)
class EntropyTemperature:
    """ARsample's dynamic temperature ``T = clamp(t0 exp(-H / alpha) + theta, lo, hi)`` (docs/ALGORITHMS.md,
    "The target q"); the defaults are the released Lumina-mGPT code's."""

    t0: float = 1.5
    alpha: float = 2.5
    theta: float = 0.7
    lo: float = 0.7
    hi: float = 2.0

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"alpha={self.alpha} must be > 0")
        if not 0 < self.lo <= self.hi:
            raise ValueError(f"needs 0 < lo <= hi, got lo={self.lo}, hi={self.hi}")


@dataclass(frozen=True)
class SamplingConfig:
    """How raw logits become the target distribution ``q`` (CFG, image-token selection, top-k, temperature).

    ``guidance_scale`` s: ``l = l_u + s (l_c - l_u)`` on raw logits (the same ``q`` as on log-softmax
    values, see :func:`csd.processors.classifier_free_guidance`). ``top_k = 0`` keeps the full vocabulary.
    ``entropy_temperature``: the per-row dynamic temperature, applied before top-k (None: off).
    """

    guidance_scale: float = 1.0
    top_k: int = 0
    temperature: float = 1.0
    entropy_temperature: EntropyTemperature | None = None


@dataclass(frozen=True)
class BodyLayout:
    """Which body positions are sampled and which are forced, and where each sits in the image grid.

    ``forced_ids[n]`` is the forced token id at position ``n`` or -1 for a free position.
    ``rows[n]`` / ``cols[n]`` give the grid cell of a free position (-1 for forced ones).
    ``jacobi_tail``: the last this-many positions are decoded one token per forward (plain AR).
    """

    forced_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    grid: tuple[int, int]
    jacobi_tail: int = 0

    @property
    def length(self) -> int:
        return int(self.forced_ids.numel())

    @classmethod
    def from_forced(cls, forced_ids: torch.Tensor, grid: tuple[int, int], jacobi_tail: int = 0) -> BodyLayout:
        """The free positions (``forced_ids < 0``) fill the ``grid`` in raster order."""
        free = forced_ids < 0
        rows = torch.full_like(forced_ids, -1)
        cols = torch.full_like(forced_ids, -1)
        cells = torch.arange(grid[0] * grid[1])
        rows[free], cols[free] = cells // grid[1], cells % grid[1]
        return cls(forced_ids, rows, cols, grid, jacobi_tail)

    @classmethod
    def raster(cls, height: int, width: int) -> BodyLayout:
        """A plain raster grid without structural tokens (Janus, the toy model)."""
        return cls.from_forced(torch.full((height * width,), -1, dtype=torch.long), (height, width))


@dataclass
class DecodeContext:
    """Per-prompt state an adapter keeps between forwards (cache, attention mask, prompt tail)."""

    cache: Any
    prompt_tail: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SlotContexts:
    """The default batch state: one single-image context per slot, and which slots the last forward ran."""

    contexts: list[DecodeContext | None]
    ran: list[bool] = field(default_factory=list)


class ModelAdapter(ABC):
    """A target model driven token by token (see the module docstring for the contract)."""

    #: number of image codes the target distribution ranges over
    vocab_size: int
    #: ``[vocab_size]`` adapter token id of each image code
    image_token_ids: torch.Tensor
    layout: BodyLayout
    sampling: SamplingConfig
    device: torch.device
    #: which ids of the raw logits' last dim are image codes (None: the raw logits are already image-only)
    raw_image_columns: torch.Tensor | None = None
    #: whether ``forward_batch(tree=...)`` and ``keep_batch`` work (SJD-PAC's tree windows, ``csd.tree``)
    tree_attention: bool = False

    @property
    def uses_cfg(self) -> bool:
        return self.sampling.guidance_scale != 1.0

    @abstractmethod
    def prefill(self, prompt: str) -> DecodeContext:
        """Encode ``prompt`` (with its unconditional branch when CFG is on) and fill a fresh cache."""

    @abstractmethod
    def forward(self, ctx: DecodeContext, ids: torch.Tensor, with_prompt_tail: bool = False) -> torch.Tensor:
        """Run the window ``ids`` ([K] body token ids) and return raw logits ``[rows, K(+1), V_raw]``."""

    @abstractmethod
    def rollback(self, ctx: DecodeContext, n: int) -> None:
        """Drop the last ``n`` entries of the cache."""

    def start_batch(self, slots: int) -> Any:
        """State for ``slots`` concurrent images (default: one single-image context per slot)."""
        return SlotContexts([None] * slots)

    def prefill_slot(self, state: Any, slot: int, prompt: str) -> None:
        """(Re)start ``slot`` with ``prompt``; the other slots are untouched."""
        state.contexts[slot] = self.prefill(prompt)

    def forward_batch(self, state: Any, ids: torch.Tensor, from_prompt: list[bool], active: list[bool],
                      tree: TreeMask | None = None) -> torch.Tensor:
        """One window per slot: ``ids [B, K]`` (column 0 the anchor, replaced by the prompt tail where
        ``from_prompt``) -> raw logits ``[B, rows, K, V_raw]``; inactive slots' outputs are zeros. ``tree``: the
        window is a tree (``csd.tree``), which only adapters with ``tree_attention`` run."""
        if tree is not None:
            raise NotImplementedError(f"{type(self).__name__} has no tree attention on this path (eager RaggedCache only)")
        outs: list[torch.Tensor | None] = []
        for slot, ctx in enumerate(state.contexts):
            if not active[slot]:
                outs.append(None)
            elif from_prompt[slot]:
                outs.append(self.forward(ctx, ids[slot, 1:], with_prompt_tail=True))
            else:
                outs.append(self.forward(ctx, ids[slot]))
        state.ran = list(active)
        template = next(out for out in outs if out is not None)
        return torch.stack([torch.zeros_like(template) if out is None else out for out in outs])

    def keep_batch(self, state: Any, q: int, keep: list[list[int]]) -> None:
        """After a tree forward of ``q`` entries: keep the entries ``keep[b]`` of each slot (adapters with ``tree_attention``)."""
        raise NotImplementedError(f"{type(self).__name__} has no tree attention on this path (eager RaggedCache only)")

    def rollback_batch(self, state: Any, n: list[int]) -> None:
        """Drop the last ``n[b]`` cache entries of every slot the last ``forward_batch`` ran."""
        for ctx, ran, k in zip(state.contexts, state.ran, n, strict=True):
            if ran:
                self.rollback(ctx, k)

    @abstractmethod
    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        """Body token ids ``[B, layout.length]`` -> uint8 images ``[B, H, W, 3]``."""

    def token_embeddings(self) -> torch.Tensor:
        """``[vocab_size, D]`` input embeddings of the image codes (GSD's embedding threshold)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no image-token embeddings")

    def codebook(self) -> torch.Tensor:
        """``[vocab_size, D]`` VQ codebook vectors (LANTERN's latent neighbourhoods)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no VQ codebook")

    def describe(self) -> dict[str, Any]:
        """Protocol facts recorded with every run (guidance, top-k, grid, ...)."""
        return {
            "adapter": type(self).__name__,
            "vocab_size": self.vocab_size,
            "grid": list(self.layout.grid),
            "body_length": self.layout.length,
            "guidance_scale": self.sampling.guidance_scale,
            "top_k": self.sampling.top_k,
            "temperature": self.sampling.temperature,
            "entropy_temperature": None if (t := self.sampling.entropy_temperature) is None else dataclasses.asdict(t),
        }


def resolve_dtype(dtype: str) -> torch.dtype:
    """A config dtype name -> torch dtype."""
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"dtype={dtype!r}: choose one of {sorted(dtypes)}")
    return dtypes[dtype]


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` in about [-1, 1] -> uint8 ``[B, H, W, 3]``: ``((x.clamp(-1,1) + 1) / 2 * 255).round()``."""
    pixels = ((images.float().clamp(-1, 1) + 1) / 2 * 255).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu()


def to_device(values: Sequence[int | bool], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host flags or counts as a device tensor without a stream sync (``torch.tensor(..., device=cuda)`` blocks
    until the queued kernels, e.g. the forward, have run; an asynchronous copy of the staged list does not)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


class MissingWeightsError(FileNotFoundError):
    """Raised (with an actionable message) when a model's files are not available offline."""
