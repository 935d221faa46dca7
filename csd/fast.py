"""The fast decoding path: a reusable ``transformers.StaticCache`` and a compiled decode step (docs/PERFORMANCE.md).

Eager decoding with a ``DynamicCache`` is bound by Python and kernel launches, not by the GPU. The
fast path keeps every decode forward at one of two fixed shapes (``q = 1`` and ``q = L``: the engine
pads drafts to the window with ``pad_window=True``) on one preallocated cache, so that
``torch.compile(mode="reduce-overhead")`` can capture each shape once as a CUDA graph and replay it
for every prompt. Prefill (any prompt length) runs eagerly on the same cache.

:class:`StaticDecoder` is generic over adapters: it drives any ``run(inputs, cache) -> logits``
(a transformers decoder fed ``inputs_embeds`` or ids, plus an output head) and owns the cache, its
length (kept in Python: reading ``StaticCache.get_seq_length()`` would be a device sync) and the
rollback of rejected window rows (:func:`rollback_static_cache`). Batched decoding (``engine.batch_size > 1``)
runs the same compiled step on a fixed-capacity ``csd.ragged.RaggedCache`` instead (:meth:`StaticDecoder.call`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import PretrainedConfig, StaticCache
from transformers.cache_utils import StaticLayer

log = logging.getLogger(__name__)

#: transformers versions whose ``StaticLayer.cumulative_length`` (an internal attribute) we roll back:
#: tested with 5.24.0 (this repo's pin); docs/PERFORMANCE.md's measurements used the same attribute on 5.17
TESTED_TRANSFORMERS = (Version("5.17"), Version("5.25.dev0"))
#: default room after the prompt and the image body for the last window's (padded) rows
WINDOW_RESERVE = 64
#: default cache lengths are rounded up to a multiple of this, so that prompts of similar length share
#: one cache (a new cache means new CUDA graphs: a recompilation)
CACHE_LEN_MULTIPLE = 256

#: ``run(inputs, cache, ...) -> logits``: a ``StaticCache`` step, or a ``RaggedCache`` one with its position ids and mask
StepFn = Callable[..., torch.Tensor]


def default_cache_len(prompt_len: int, body_len: int) -> int:
    """Cache entries for a prompt of ``prompt_len`` entries, the body and ``WINDOW_RESERVE``, rounded up to
    ``CACHE_LEN_MULTIPLE``."""
    return math.ceil((prompt_len + body_len + WINDOW_RESERVE) / CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE


def check_transformers_version(version: str = transformers.__version__) -> None:
    """Raise unless ``version`` lies in the range whose StaticCache internals :func:`rollback_static_cache` uses."""
    low, high = TESTED_TRANSFORMERS
    if not low <= Version(version) < high:
        raise RuntimeError(
            f"csd.fast rolls back transformers.StaticCache through the internal StaticLayer.cumulative_length, "
            f"tested with transformers >={low},<{high}; found {version}. Install transformers==5.24.0 "
            f"or decode with the dynamic cache (engine.compile=false)."
        )


def rollback_static_cache(cache: StaticCache, n: int) -> None:
    """Drop the last ``n`` entries of every layer of ``cache`` (``StaticCache`` has no public rollback).

    Only each layer's write position ``cumulative_length`` (a 0-d device tensor at a static address,
    read by the compiled step) moves back; the stale keys and values stay in place, masked out, until
    the next forward overwrites them. One fused in-place kernel for all layers, no host sync.
    """
    if n < 0:
        raise ValueError(f"rollback needs n >= 0, got {n}")
    lengths = []
    for layer in cache.layers:
        if type(layer) is not StaticLayer or not isinstance(
            getattr(layer, "cumulative_length", None), torch.Tensor
        ):
            raise TypeError(
                f"rollback_static_cache supports full-attention StaticLayer layers with a tensor cumulative_length, "
                f"got {type(layer).__name__}"
            )
        lengths.append(layer.cumulative_length)
    if n:
        torch._foreach_sub_(lengths, n)


def compile_step(step: StepFn, backend: str = "inductor") -> StepFn:
    """``step`` compiled once per input shape, graph-break free, never dynamic.

    With ``inductor`` on CUDA, ``mode="reduce-overhead"`` captures each shape as a CUDA graph. Other
    backends (``aot_eager``, ``eager``) trace the same full graph without generating code: CPU tests use
    them to check that the step compiles without graph breaks or recompilations in seconds.
    """
    mode = {"mode": "reduce-overhead"} if backend == "inductor" else {}
    return torch.compile(step, backend=backend, fullgraph=True, dynamic=False, **mode)


class StaticDecoder:
    """A decoder on one reusable ``StaticCache``, with an optionally compiled decode step.

    ``run(inputs, cache)`` maps ``inputs [rows, q, ...]`` (embeddings or ids) to logits ``[rows, q, V]``
    and appends ``q`` entries to ``cache``. One cache is kept per ``(rows, max_cache_len)`` and reset for
    every prompt; ``prefill`` runs eagerly, ``step`` through the compiled function when ``backend`` is set.
    ``body_len`` is how many entries are decoded after a prompt (the image body); with ``WINDOW_RESERVE``
    more for the last window's rows it sizes the cache when ``max_cache_len`` is None.

    State belongs to the current prompt: a new :meth:`prefill` invalidates the previous one.
    """

    def __init__(
        self,
        run: StepFn,
        config: PretrainedConfig,
        body_len: int,
        max_cache_len: int | None = None,
        backend: str | None = None,
    ) -> None:
        check_transformers_version()
        self.run, self.config, self.body_len, self.max_cache_len = run, config, body_len, max_cache_len
        self.compiled = backend is not None
        self.step_fn = compile_step(run, backend) if backend is not None else run
        self.caches: dict[tuple[int, int], StaticCache] = {}
        self.cache: StaticCache | None = None
        self.capacity = self.length = 0

    def cache_len_for(self, prompt_len: int) -> int:
        """The cache length a prompt of ``prompt_len`` entries gets (the configured one when set)."""
        if self.max_cache_len is not None:
            return self.max_cache_len
        return default_cache_len(prompt_len, self.body_len)

    def _select_cache(self, rows: int, prompt_len: int) -> tuple[StaticCache, int]:
        length = self.cache_len_for(prompt_len)
        if prompt_len + self.body_len > length:
            raise ValueError(
                f"a prompt of {prompt_len} cache entries plus a body of {self.body_len} does not fit "
                f"max_cache_len={length}; raise engine.max_cache_len"
            )
        key = (rows, length)
        if key not in self.caches:
            if self.caches and self.compiled:
                log.warning(
                    "new StaticCache %s besides %s: the decode step recompiles", key, sorted(self.caches)
                )
            self.caches[key] = StaticCache(config=self.config, max_cache_len=length)
        return self.caches[key], length

    @torch.no_grad()
    def prefill(self, inputs: torch.Tensor) -> None:
        """Reset the cache for ``inputs.shape[0]`` rows and fill it with ``inputs`` (eagerly, any length)."""
        self.cache, self.capacity = self._select_cache(inputs.shape[0], inputs.shape[1])
        self.cache.reset()
        self.length = 0
        if inputs.shape[1]:
            self.run(inputs, self.cache)
            self.length = inputs.shape[1]

    @torch.no_grad()
    def step(self, inputs: torch.Tensor) -> torch.Tensor:
        """Append ``inputs [rows, q, ...]`` and return their logits (a fresh tensor, safe to keep)."""
        q = inputs.shape[1]
        if self.cache is None:
            raise RuntimeError("StaticDecoder.step before prefill")
        if self.length + q > self.capacity:
            raise ValueError(
                f"cache overflow: {self.length} + {q} entries > max_cache_len={self.capacity}; raise engine.max_cache_len"
            )
        # strides are part of a compiled shape: an expanded (stride-0) input would trace a second graph
        logits = self.call(inputs.contiguous(), self.cache)
        self.length += q
        return logits

    def call(self, *args: Any) -> torch.Tensor:
        """``step_fn(*args)``; compiled, as a new CUDA-graph step whose output is cloned (a replay overwrites
        its output buffer, so the caller keeps a copy)."""
        if not self.compiled:
            return self.step_fn(*args)
        torch.compiler.cudagraph_mark_step_begin()
        return self.step_fn(*args).clone()

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` entries (the rejected rows of a window)."""
        if n > self.length:
            raise ValueError(f"cannot roll back {n} of {self.length} cache entries")
        rollback_static_cache(self.cache, n)
        self.length -= n


class StaticDispatch:
    """Adapter mixin: one decode step and rollback for both paths.

    Subclasses set ``static`` (a :class:`StaticDecoder`, or None for the eager path on a per-context
    ``DynamicCache``) and define ``decode_step(inputs, cache)``.
    """

    static: StaticDecoder | None

    def run_step(self, inputs: torch.Tensor, cache) -> torch.Tensor:
        """Logits of ``inputs`` appended to the context: the static decoder's step, else ``decode_step``."""
        if self.static is not None:
            return self.static.step(inputs)
        with torch.no_grad():
            return self.decode_step(inputs, cache)

    def rollback(self, ctx, n: int) -> None:
        """Drop the last ``n`` cache entries of ``ctx`` (the static cache when compiled)."""
        if self.static is not None:
            self.static.rollback(n)
        elif n > 0:
            ctx.cache.crop(-n)


def make_static_decoder(
    run: StepFn,
    config: PretrainedConfig,
    body_len: int,
    cache: str = "dynamic",
    compile: bool = False,
    max_cache_len: int | None = None,
    compile_backend: str = "inductor",
) -> StaticDecoder | None:
    """An adapter's cache choice: ``None`` for the eager ``DynamicCache`` path, else a :class:`StaticDecoder`
    (compiled when ``compile``)."""
    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    if compile and cache != "static":
        raise ValueError("compile=True needs cache='static'")
    if cache == "dynamic":
        return None
    return StaticDecoder(run, config, body_len, max_cache_len, compile_backend if compile else None)
