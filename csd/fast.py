"""The compiled decoding path (docs/PERFORMANCE.md): an adapter's decode step, with the engine's target step on its
output, compiled once per input shape.

Eager decoding is bound by Python and kernel launches, not by the GPU. The compiled path keeps every decode
forward at one of two fixed shapes (``q = 1`` and ``q = L``: the engine pads drafts to the window) on one
fixed-capacity ``csd.cache.RaggedCache``, so that inductor's ``reduce-overhead`` mode can capture each shape
once as a CUDA graph and replay it for every prompt and batch. Prefill (any prompt length) runs eagerly on the
same cache.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from csd.acceptance import entropy
from csd.adapters.base import ModelAdapter, anchor_inputs
from csd.cache import RaggedCache, default_cache_len
from csd.verify import sample_race

#: ``decode_step(inputs, cache, position_ids, attention_mask) -> logits``
StepFn = Callable[..., torch.Tensor]
#: ``body_inputs(ids [N, K]) -> [N, K, ...]`` model inputs of body token ids
EmbedFn = Callable[[torch.Tensor], torch.Tensor]
#: the engine's target pipeline (``csd.processors.TargetPipeline``): raw logits ``[B, rows, K, V_raw]`` -> ``q [B, K, V]``
TargetFn = Callable[[torch.Tensor], torch.Tensor]
#: whether ``torch.compile`` keeps each call's graphs to itself (``isolate_recompiles``, new in torch 2.13; the pinned
#: 2.14 has it). Where it does not (an older torch already installed, e.g. on a GPU image), the module-tree guards stay:
#: without isolation they are what tells two adapters of one class apart.
ISOLATES = "isolate_recompiles" in inspect.signature(torch.compile).parameters


def isolation() -> dict[str, bool]:
    """``torch.compile``'s keyword that keeps a call's graphs to itself, where torch has it (:data:`ISOLATES`)."""
    return {"isolate_recompiles": True} if ISOLATES else {}


def step_and_target(step: StepFn, embed: EmbedFn, target: TargetFn | None, rows: int, ids: torch.Tensor,
                    cache: RaggedCache, tail: torch.Tensor, anchored: torch.Tensor, noise: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """One decode step on every row of a fixed cache and, with ``target``, the engine's target step on its output, as
    one function to compile: the model inputs of every slot's window ``ids [N / rows, q]`` (``embed``, the adapter's
    ``body_inputs``, of each CFG row; column 0 of a row flagged in ``anchored [N]`` is its prompt's last token's input
    ``tail [N, 1, ...]``: ``csd.adapters.base.anchor_inputs``, as on the eager path), the step's position ids and
    mask from the cache's device lengths (``RaggedCache.feed``, after ``RaggedCache.reserve``), raw logits
    ``[N, q, V_raw]`` (``N`` = slots x ``rows`` CFG rows), ``q = target(raw as [N / rows, rows, q, V_raw])`` for every
    column and its entropy ``H(q)`` (docs/ALGORITHMS.md "The engine loop", steps 1-3), and with ``noise`` (``Exp(1)``
    of every column, ``[N / rows, q, V]``: one-row windows, drawn before the step) every column's sample
    ``argmax_v q(v) / E_v`` (:func:`csd.verify.sample_race`, step 4 of a window without drafts); what is not computed
    is None."""
    inputs = anchor_inputs(embed(ids.repeat_interleave(rows, dim=0)), tail, anchored)
    position_ids, attention_mask = cache.feed(ids.shape[1])
    raw = step(inputs, cache, position_ids, attention_mask)
    if target is None:
        return raw, None, None, None
    q = target(raw.view(-1, rows, *raw.shape[1:]))
    return raw, q, entropy(q), None if noise is None else sample_race(q, noise)


def compile_step(step: StepFn, backend: str = "inductor") -> StepFn:
    """``step`` compiled once per input shape, graph-break free, never dynamic, its graphs its own.

    With ``inductor`` on CUDA, ``triton.cudagraphs`` (``mode="reduce-overhead"``) captures each shape as a CUDA graph.
    Other backends (``aot_eager``, ``eager``) trace the same full graph without generating code: CPU tests use them to
    check that the step compiles without graph breaks or recompilations in seconds.

    Guards: every call checks dynamo's guards before it replays a graph. Kept: those on the step's arguments (ids,
    the prompts' last inputs and anchor flags, the cache's buffers, lengths and host fields), the global state and
    the module globals the traced code reads. Dropped (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``): those
    on the model's module tree, its attributes, hooks, submodules and parameters, one set per decoder layer, whose
    check cost grows with depth (docs/PERFORMANCE.md "Guards"). The model is taken as frozen once compiled: one changed in place afterwards (attributes,
    hooks, layers, a parameter's dtype or device) needs a new :class:`CompiledStep`. ``isolate_recompiles`` keeps each
    call's graphs to itself, so another adapter of the same class, whose module tree those guards would have told
    apart, never replays them. A torch without ``isolate_recompiles`` (:data:`ISOLATES`) keeps every guard.
    """
    options: dict[str, Any] = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe} if ISOLATES else {}
    if backend == "inductor":
        options |= torch._inductor.list_mode_options("reduce-overhead")
    return torch.compile(step, backend=backend, fullgraph=True, dynamic=False, options=options, **isolation())


class CompiledStep:
    """``adapter.decode_step`` and the engine's target step compiled together (:func:`step_and_target`,
    :func:`compile_step`), and the fixed-capacity cache it runs on.

    The cache of the last batch is kept and reused by the next one of the same shape (new buffers would
    re-record the CUDA graphs); one batch decodes on it at a time. Its capacity is ``max_cache_len``, else
    :func:`csd.cache.default_cache_len` of the batch's first prompt.
    """

    def __init__(self, adapter: ModelAdapter, max_cache_len: int | None = None, backend: str = "inductor") -> None:
        if not adapter.compilable:
            raise ValueError(f"engine.compile=true: {type(adapter).__name__} has no compiled path; use engine.compile=false")
        self.adapter, self.max_cache_len, self.backend = adapter, max_cache_len, backend
        self.step_fn = compile_step(step_and_target, backend)
        self.decode_step: StepFn = adapter.decode_step  # the bound methods the graphs were traced with
        self.body_inputs: EmbedFn = adapter.body_inputs
        self.cache: RaggedCache | None = None
        self.compiled_post: dict[Callable[..., Any], Callable[..., Any]] = {}  # :meth:`compile`'s, one per function

    def cache_len_for(self, prompt_len: int) -> int:
        """The cache length a prompt of ``prompt_len`` entries gets (the configured one when set)."""
        if self.max_cache_len is not None:
            return self.max_cache_len
        return default_cache_len(prompt_len, self.adapter.layout.length)

    def fixed_cache(self, rows: int, prompt_len: int) -> RaggedCache:
        """The fixed cache of ``rows`` rows for a batch whose first prompt has ``prompt_len`` entries, emptied; the
        previous one when it has this shape."""
        capacity = self.cache_len_for(prompt_len)
        cache = self.cache
        if cache is None or (cache.rows, cache.capacity) != (rows, capacity):
            self.cache = None  # free the old buffers first
            decoder = self.adapter.decoder()
            cache = RaggedCache(decoder.config, rows, capacity, decoder.dtype, decoder.device, fixed=True)
            self.cache = cache
        cache.reset(slice(0, rows))
        return cache

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` compiled with the step's backend, one graph per input shape, but without CUDA graphs (the engine's
        verification, docs/PERFORMANCE.md "Engine overhead", whose outputs outlive the iteration: the row samples become
        the next drafts, which a replay would overwrite) and without ``fullgraph``: past dynamo's recompile limit (8
        graphs of one function; a sweep of many rules and batch sizes in one process) ``fn`` runs eagerly, with dynamo's
        warning, where ``fullgraph`` would stop the run. That every rule traces without a graph break is tested. Its
        graphs are this step's own (``isolate_recompiles``, where torch has it: :data:`ISOLATES`): a sweep in one
        process (Hydra's basic launcher, a compiled step per job) would otherwise pile every job's graphs onto one
        limit and run the later jobs' verification eagerly. Every engine on this step (one per rule, say) gets the same
        compiled ``fn`` and shares its graphs: one per rule class and window shape, since the engine passes the rule's
        real-valued parameters as tensors (``csd.params.Parametrized.with_tensor_params``), inputs of the graph
        rather than constants of its trace (a graph per value)."""
        if fn not in self.compiled_post:
            self.compiled_post[fn] = torch.compile(fn, backend=self.backend, dynamic=False, **isolation())
        return self.compiled_post[fn]

    def captures(self, device: torch.device) -> bool:
        """Whether the step's graphs are CUDA graphs on ``device`` (inductor's ``reduce-overhead`` mode on CUDA), whose
        replays overwrite their output buffers."""
        return self.backend == "inductor" and device.type == "cuda"

    def __call__(self, ids: torch.Tensor, cache: RaggedCache, tail: torch.Tensor, anchored: torch.Tensor,
                 target: TargetFn | None = None, rows: int = 1, noise: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The compiled :func:`step_and_target` of the adapter's step on the windows ``ids`` of every slot of ``cache``
        (after ``cache.reserve``; ``rows``: CFG rows per slot; ``tail`` and ``anchored``: the prompts' last inputs and
        the rows whose window starts with it; ``noise``: one-row windows' ``Exp(1)`` noise, whose samples the graph
        then draws). As CUDA graphs (:meth:`captures`) each call is a new step whose outputs are cloned: a replay
        overwrites its output buffers, so the caller keeps copies. One graph per window length, ``target`` and whether
        ``noise`` is given (the engine always passes its own target, and noise exactly for one-row windows)."""
        torch.compiler.cudagraph_mark_step_begin()
        out = self.step_fn(self.decode_step, self.body_inputs, target, rows, ids, cache, tail, anchored, noise)
        if not self.captures(ids.device):
            return out
        return tuple(None if t is None else t.clone() for t in out)  # type: ignore[return-value]
