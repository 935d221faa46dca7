"""The model adapter interface: what a target model must say for the decoding engine to drive it.

The engine (``csd.engine``) knows nothing about Janus, Lumina-mGPT or the toy model; an adapter knows
nothing about acceptance rules or caches. The contract, in the vocabulary of docs/ALGORITHMS.md:

* The image is a **body** of ``layout.length`` positions. A position is either *free* (its token is
  sampled from the image vocabulary of ``vocab_size`` codes) or *forced* (a deterministic structural
  token such as Lumina-mGPT's end-of-line; ``layout.forced_ids[n] >= 0``).
* The engine holds body tokens as **token ids in the adapter's space**; index ``v`` of a target
  distribution corresponds to id ``image_token_ids[v]``.
* ``prompt_inputs(prompt)``: the model inputs of each CFG row's prompt (conditional first, then unconditional when
  ``sampling.guidance_scale != 1``), ids or embeddings; rows may differ in length, and one may be empty.
* ``body_inputs(ids [N, K])``: the model inputs of body token ids.
* ``decode_step(inputs, cache, position_ids, attention_mask)``: one forward of the decoder and the output head,
  **raw** logits ``[N, q, V_raw]``; ``cache`` is a ``csd.cache.RaggedCache`` (None: a plain full-sequence forward,
  the tests' oracle). Turning logits into the target ``q`` is the shared processor pipeline's job
  (``csd.processors``), built from ``sampling``.
* ``decoder()``: the transformers decoder whose layers the cache serves (its config, dtype, device).
* Optional, for drafters that read the target's hidden states (``drafter=eagle``): ``features_step`` (the same
  arguments as ``decode_step``: the decoder's last hidden states ``[N, q, D]``, after its final norm, the vectors the
  output head reads), ``head(features)`` (raw logits; ``decode_step = head(features_step(...))``) and
  ``embed(ids [N, K])`` (the input embeddings ``[N, K, D]`` of body token ids).
* ``decode_images(ids)``, and for some rules ``token_embeddings()`` (GSD) and ``codebook()`` (LANTERN).

``csd.ragged.SlotBatch`` runs every decode, batch 1 included, on these.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from csd.errors import DependencyError

L = TypeVar("L", bound=Callable[..., Any])

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
    #: whether the decode step compiles (``csd.fast.CompiledStep``, ``engine.compile=true``)
    compilable: bool = False
    #: the shipped EAGLE head file (``drafter=eagle``'s default ``drafter.head``), None: none shipped
    eagle_head: Path | None = None
    #: the shipped SSD spatial heads file (``drafter=ssd``'s default ``drafter.heads``), None: none shipped
    spatial_heads: Path | None = None

    #: the captions the model reads, for a message refusing another (None: any text; see :meth:`caption_problem`)
    reads: str | None = None

    @classmethod
    def caption_problem(cls, caption: str) -> str | None:
        """Why the model cannot read ``caption`` (e.g. ``"has 2 unknown words ('apple', 'table')"``), None if it can;
        known before any weight loads, so prompts are refused where they are loaded (the toy's word vocabulary)."""
        return None

    @property
    def uses_cfg(self) -> bool:
        return self.sampling.guidance_scale != 1.0

    @abstractmethod
    def prompt_inputs(self, prompt: str) -> torch.Tensor | list[torch.Tensor]:
        """Model inputs of the prompt's CFG rows: ``[rows, T, ...]``, or one ``[T_r, ...]`` per row (may be empty)."""

    @abstractmethod
    def body_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        """Model inputs ``[N, K, ...]`` of body token ids ``[N, K]``."""

    @abstractmethod
    def decode_step(self, inputs: torch.Tensor, cache: Any, position_ids: torch.Tensor | None,
                    attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Decoder + output head: ``inputs [N, q, ...]`` -> raw logits ``[N, q, V_raw]`` (``cache``: a
        ``csd.cache.RaggedCache`` with the position ids and 4D additive mask its ``extend`` returned, or None)."""

    @abstractmethod
    def decoder(self) -> Any:
        """The transformers decoder (a ``PreTrainedModel``) whose attention layers the cache serves."""

    @abstractmethod
    def decode_images(self, ids: torch.Tensor) -> torch.Tensor:
        """Body token ids ``[B, layout.length]`` -> uint8 images ``[B, H, W, 3]``."""

    def features_step(self, inputs: torch.Tensor, cache: Any, position_ids: torch.Tensor | None,
                      attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The decoder alone: ``inputs [N, q, ...]`` -> its last hidden states ``[N, q, D]`` (after the final norm)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no hidden states")

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """The output head: hidden states ``[..., D]`` -> raw logits ``[..., V_raw]``."""
        raise NotImplementedError(f"{type(self).__name__} exposes no output head")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings ``[N, K, D]`` of body token ids ``[N, K]`` (what the decoder's first layer reads)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no input embeddings")

    @classmethod
    def exposes_features(cls) -> bool:
        """Whether :meth:`features_step`, :meth:`head` and :meth:`embed` are implemented (known before any weight
        loads)."""
        return cls.features_step is not ModelAdapter.features_step

    def token_embeddings(self) -> torch.Tensor:
        """``[vocab_size, D]`` input embeddings of the image codes (GSD's embedding threshold)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no image-token embeddings")

    def codebook(self) -> torch.Tensor:
        """``[vocab_size, D]`` VQ codebook vectors (LANTERN's latent neighbourhoods)."""
        raise NotImplementedError(f"{type(self).__name__} exposes no VQ codebook")

    def token_ids(self) -> dict[str, list[int]]:
        """The ids a body may hold, recorded in run.json for readers to check records against
        (:func:`csd.records.body_problem`): ``image``, the least and largest image code's id; ``forced``, the forced
        positions' ids."""
        forced = self.layout.forced_ids
        return {"image": [int(self.image_token_ids.min()), int(self.image_token_ids.max())],
                "forced": sorted({int(i) for i in forced[forced >= 0].tolist()})}

    def describe(self) -> dict[str, Any]:
        """Protocol facts recorded with every run (guidance, top-k, grid, ...)."""
        return {
            "adapter": type(self).__name__,
            "vocab_size": self.vocab_size,
            "grid": list(self.layout.grid),
            "body_length": self.layout.length,
            "token_ids": self.token_ids(),
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


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules in ``dtype`` (``torch.set_default_dtype`` for the block): random weights of a large model are
    drawn once in their dtype instead of in fp32 and cast (half the peak memory at bf16)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` in about [-1, 1] -> uint8 ``[B, H, W, 3]``: ``((x.clamp(-1,1) + 1) / 2 * 255).round()``."""
    pixels = ((images.float().clamp(-1, 1) + 1) / 2 * 255).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).cpu()


#: the first transformers release whose decoders take the KV cache as ``cache=``, the keyword every adapter passes
#: (earlier releases read ``past_key_values=``, ignore ``cache=`` and attend over a cache of their own: the adapter's
#: mask then has the wrong width, a shape error deep in the attention)
MIN_TRANSFORMERS = "5.24.0"


def check_transformers(installed: str | None = None) -> None:
    """Raise :class:`DependencyError` in one line when the installed transformers (``installed``: that version
    instead) is older than :data:`MIN_TRANSFORMERS`; reads the package's metadata (a checkout without any: its
    ``__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    if installed is None:
        try:
            installed = version("transformers")
        except PackageNotFoundError:
            import transformers

            installed = transformers.__version__
    if Version(installed) < Version(MIN_TRANSFORMERS):
        raise DependencyError(
            f"transformers {installed} is installed; the model adapters need transformers >= {MIN_TRANSFORMERS} (they "
            f"pass the KV cache as cache=, which older releases ignore): pip install 'transformers=={MIN_TRANSFORMERS}'"
        )


check_transformers()  # every adapter module imports this one: a script that builds a model is refused here too


#: a loader's ``_target_`` (``module.function``) -> its weights check: called with the loader's config values, it
#: raises the :class:`MissingWeightsError` the loader would, without loading anything (``csd.compose.check_weights``)
WEIGHTS_CHECKS: dict[str, Callable[..., None]] = {}


def checks_weights(check: Callable[..., None]) -> Callable[[L], L]:
    """Register ``check`` as the weights check of the decorated loader (:data:`WEIGHTS_CHECKS`): a run refuses missing
    files before anything is created or launched, a multirun for every job before the first starts."""
    def register(loader: L) -> L:
        WEIGHTS_CHECKS[f"{loader.__module__}.{loader.__name__}"] = check
        return loader

    return register


def anchor_inputs(inputs: torch.Tensor, tail: torch.Tensor, anchored: torch.Tensor) -> torch.Tensor:
    """``inputs [N, K, ...]`` with column 0 of each row flagged in ``anchored [N]`` (a slot's first window) replaced by
    ``tail [N, 1, ...]``, the input of that row's prompt's last token."""
    anchors = anchored.view(-1, *[1] * (inputs.dim() - 1))
    return torch.cat([torch.where(anchors, tail, inputs[:, :1]), inputs[:, 1:]], dim=1)
