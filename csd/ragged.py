"""Images in flight on one cache (:class:`SlotBatch`): the batch forward of every slot's window on the ragged cache
(``csd.cache.RaggedCache``, a length per row) through an adapter's decode step (``csd.adapters.base``: prompt inputs,
body inputs, one decode step): prefill a slot, one forward for every slot's window, roll back or keep each slot's
entries. :func:`reference_logits` is the no-cache oracle the tests compare it with.

Compiled (``engine.compile=true``, ``csd.fast.CompiledStep``): the decode step is compiled, with the engine's target
step on its output (``forward(target=...)``), fed ``[B * rows, L]`` or ``[B * rows, 1]`` (the engine pads windows), so
two graphs in all, on every row of the fixed cache. The graph takes the window's ids: their model inputs (the
adapter's ``body_inputs``, the first windows' prompt anchors: ``csd.adapters.base.anchor_inputs``), the position
ids, write indices and the mask (from the device ``lengths``: ``RaggedCache.reserve`` / ``feed`` / ``advance``) are
computed in it; prefill is eager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from csd.adapters.base import ModelAdapter, anchor_inputs
from csd.cache import RaggedCache, default_cache_len
from csd.device import to_device
from csd.tree import TreeMask


class FixedStep(Protocol):
    """A decode step compiled for a fixed cache (``csd.fast.CompiledStep``): the cache it gives a batch, emptied, and
    ``step(ids, cache, tail, anchored, target, rows) -> (logits, q, H(q))`` of every slot's window ``ids`` on every
    row of it, after ``cache.reserve`` (``tail``, ``anchored``: ``csd.adapters.base.anchor_inputs``; ``q``:
    ``target`` of the logits, None without it)."""

    def fixed_cache(self, rows: int, prompt_len: int) -> RaggedCache: ...

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]: ...


class SlotBatch:
    """``slots`` images decoding at once on one :class:`RaggedCache` through an adapter's decode step.

    The adapter (``csd.adapters.base.ModelAdapter``) gives ``prompt_inputs(prompt)`` (model inputs of the CFG rows
    of a prompt: a ``[rows, T, ...]`` tensor, or one ``[T_r, ...]`` tensor per row when their lengths differ; a row
    may be empty), ``body_inputs(ids [N, K]) -> [N, K, ...]``, ``decode_step(inputs, cache, position_ids,
    attention_mask) -> [N, q, V]`` and ``decoder()`` (the transformers decoder whose layers the cache serves).
    Eager (``compiled`` None): the cache grows with the prompts. Compiled: the cache of ``compiled``, fixed.
    """

    def __init__(self, adapter: ModelAdapter, slots: int, compiled: FixedStep | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots={slots} must be >= 1")
        self.adapter, self.slots, self.compiled = adapter, slots, compiled
        self.rows = 2 if adapter.uses_cfg else 1
        decoder = adapter.decoder()
        #: eager: sized by the first prompts and grown as needed; compiled: picked by the first prefill
        self.cache = None if compiled else RaggedCache(decoder.config, slots * self.rows, 0, decoder.dtype, decoder.device)
        #: ``[slots * rows, 1, ...]`` model input of each row's last prompt token (ids or embeddings)
        self.prompt_tail: torch.Tensor | None = None
        #: compiled: per cache row, its window starts with its prompt's last token (set for that forward only)
        self.anchored: torch.Tensor | None = None
        #: which slots the last forward advanced
        self.ran = [False] * slots
        #: per cache row: its prompt is empty (its anchor is a placeholder that predicts nothing)
        self.no_prompt: list[bool] = []

    @property
    def tree_attention(self) -> bool:
        """Tree windows (``forward(tree=...)``, :meth:`keep`) run on the eager cache."""
        return self.compiled is None

    def slot_rows(self, slot: int) -> slice:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot={slot} must be in [0, {self.slots})")
        return slice(slot * self.rows, (slot + 1) * self.rows)

    @torch.no_grad()
    def prefill(self, slot: int, prompt: str) -> None:
        """(Re)start ``slot``: each row holds every token of its own prompt but the last, kept as the row's first
        anchor. Rows of different prompt lengths prefill in one forward, right-padded to the longest (the
        padding lands past each row's length and is rolled back); a row with an empty prompt gets a placeholder
        anchor that no query sees (``RaggedCache.reset``), whose prediction :meth:`forward` replaces.

        Eager: the cache grows (other rows keep their entries) when the prompt plus the image body and a window
        reserve do not fit (:func:`default_cache_len`). Compiled: the batch's first prompt picks the fixed capacity
        (``engine.max_cache_len`` when set); a later prompt must fit it.
        """
        rows = self.slot_rows(slot)
        inputs = list(self.adapter.prompt_inputs(prompt))
        lengths = [row.shape[0] for row in inputs]
        prompt_len, body_len = max(lengths) - 1, self.adapter.layout.length
        if self.compiled is None:
            self.cache.grow(default_cache_len(prompt_len, body_len))
        else:
            if self.cache is None:
                self.cache = self.compiled.fixed_cache(self.slots * self.rows, prompt_len)
            if prompt_len + body_len > self.cache.capacity:
                raise ValueError(
                    f"a prompt of {prompt_len} cache entries plus a body of {body_len} does not fit the compiled "
                    f"cache of {self.cache.capacity} entries; raise engine.max_cache_len"
                )
        tails = torch.stack([row[-1] if n else row.new_zeros(row.shape[1:]) for row, n in zip(inputs, lengths, strict=True)])
        if self.prompt_tail is None:
            self.prompt_tail = tails.new_zeros((self.cache.rows, 1, *tails.shape[1:]))
            self.anchored = torch.zeros(self.cache.rows, dtype=torch.bool, device=self.cache.device)
            self.no_prompt = [False] * self.cache.rows
        self.prompt_tail[rows] = tails.unsqueeze(1)
        self.no_prompt[rows] = [n == 0 for n in lengths]
        self.cache.reset(rows, self.no_prompt[rows])
        if prompt_len > 0:
            body = torch.nn.utils.rnn.pad_sequence([row[:-1] for row in inputs], batch_first=True)
            position_ids, mask = self.cache.extend(rows, prompt_len, [n > 0 for n in lengths])
            self.adapter.decode_step(body, self.cache, position_ids, mask)
            padding = [0] * self.cache.rows
            padding[rows] = [prompt_len + 1 - n if n else 0 for n in lengths]
            if any(padding):
                self.cache.rollback(padding)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, from_prompt: Sequence[bool], active: Sequence[bool],
                tree: TreeMask | None = None, features: bool = False, shift: torch.Tensor | None = None,
                groups: torch.Tensor | None = None, target: Callable[[torch.Tensor], torch.Tensor] | None = None,
                noise: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """One forward of every slot's window ``ids [B, K]`` (column 0 the anchor; the prompt's last token where
        ``from_prompt``): raw logits ``[B, rows, K, V]``, row for row those of :func:`reference_logits`. Inactive
        slots' caches do not advance and their logits are meaningless. A row with an empty prompt has no context for
        its placeholder anchor's prediction: that column is the slot's first row's (under CFG: the prediction is
        unguided). ``tree``: every slot's window is that tree (``RaggedCache.extend``; eager only). ``features``:
        also return the decoder's last hidden states ``[B, rows, K, D]`` the logits were computed from
        (``logits = adapter.head(features)``, the same forward), as ``(logits, features)``. ``shift [B, K]``: each
        slot's position-id shifts and ``groups [B, K]`` its entries' chains (``RaggedCache.extend``; eager only).
        ``target`` (the engine's target pipeline, logits -> ``q [B, K, V]``): returns ``(logits, (q, H(q), y))`` of every
        column, computed in the compiled step's graph, or ``(logits, None)``, eagerly or when a column was replaced
        (an empty prompt's first window): the caller computes them from the logits. ``noise [B, K, V]`` (with
        ``target``, compiled; one-row windows): ``Exp(1)`` noise of every column, whose samples ``y [B, K]`` the graph
        draws (:func:`csd.verify.sample_race`); without it ``y`` is None."""
        slots, k = ids.shape
        if slots != self.slots or self.prompt_tail is None:
            raise ValueError(f"forward needs ids for all {self.slots} slots after a prefill, got {slots}")
        if tree is not None and not self.tree_attention:
            raise ValueError("tree windows run on the eager cache: engine.compile must be false")
        if shift is not None and self.compiled is not None:
            raise ValueError("shifted position ids run on the eager cache: engine.compile must be false")
        if noise is not None and (self.compiled is None or target is None or features):
            raise ValueError("noise: only the compiled step with the target samples in its graph")
        rows = self.rows
        ids = ids.to(self.cache.device)
        anchored = None
        if any(from_prompt):  # a slot's first window: its anchor is the prompt's last token
            anchored = to_device(from_prompt, self.cache.device, torch.bool).repeat_interleave(rows)
        advance = [a for a in active for _ in range(rows)]
        self.ran = list(active)
        if self.compiled is not None and not features:
            # the compiled step (inputs, positions, mask, target): one graph per window length K (1 or the padded L)
            if anchored is not None:
                self.anchored.copy_(anchored)
            self.cache.reserve(k, advance)
            # contiguous ids: an expanded (stride-0) window would trace another graph
            logits, q, q_entropy, y = self.compiled(ids.contiguous(), self.cache, self.prompt_tail, self.anchored,
                                                    target, rows, noise)
            self.cache.advance(slice(0, self.cache.rows), k, advance)
            if anchored is not None:
                self.anchored.zero_()
            return self._outputs(logits, None, from_prompt, target, (q, q_entropy, y))
        inputs = self.adapter.body_inputs(ids.repeat_interleave(rows, dim=0))
        if anchored is not None:
            inputs = anchor_inputs(inputs, self.prompt_tail, anchored)
        if tree is not None:  # a tree's nodes may reach past the body by its siblings: room beyond the reserve
            self.cache.grow(max(self.cache.filled) + k)
        if shift is not None:
            shift = shift.to(self.cache.device).repeat_interleave(rows, dim=0)
        if groups is not None:
            groups = groups.to(self.cache.device).repeat_interleave(rows, dim=0)
        position_ids, mask = self.cache.extend(slice(0, self.cache.rows), k, advance, tree, shift, groups)
        hidden = None
        if features:
            hidden = self.adapter.features_step(inputs, self.cache, position_ids, mask)
            logits = self.adapter.head(hidden)
        else:
            logits = self.adapter.decode_step(inputs, self.cache, position_ids, mask)
        return self._outputs(logits, hidden, from_prompt, target, None)

    def _outputs(self, logits: torch.Tensor, hidden: torch.Tensor | None, from_prompt: Sequence[bool],
                 target: Callable[[torch.Tensor], torch.Tensor] | None,
                 folded: tuple[torch.Tensor | None, ...] | None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """:meth:`forward`'s result from the step's ``logits [N, K, V]`` (``hidden``: its features; ``folded``: the
        compiled step's target, entropy and samples): an empty prompt's placeholder column replaced by the slot's first row's."""
        slots, rows = self.slots, self.rows
        blind = [first and empty for first, row in zip(from_prompt, range(0, self.cache.rows, rows), strict=True)
                 for empty in self.no_prompt[row : row + rows]]
        logits = _first_row_where(blind, logits.view(slots, rows, logits.shape[1], -1))
        if target is not None:
            return logits, folded if folded is not None and not any(blind) else None
        if hidden is None:
            return logits
        return logits, _first_row_where(blind, hidden.view(slots, rows, hidden.shape[1], -1))

    def keep(self, q: int, keep: Sequence[Sequence[int]]) -> None:
        """After a tree forward of ``q`` entries, for each slot it advanced: keep the entries ``keep[b]`` (window
        indices: the root and the accepted path) at the front of its window and drop the rest."""
        for slot, (nodes, ran) in enumerate(zip(keep, self.ran, strict=True)):
            if ran:
                rows = self.slot_rows(slot)
                self.cache.compact(range(rows.start, rows.stop), q, nodes)

    def rollback(self, n: Sequence[int]) -> None:
        """Drop the last ``n[b]`` entries of every row of slot ``b``, for each slot the last forward advanced."""
        if len(n) != self.slots:
            raise ValueError(f"rollback needs one count per slot ({self.slots}), got {len(n)}")
        self.cache.rollback([int(k) * ran for k, ran in zip(n, self.ran, strict=True) for _ in range(self.rows)])


def _first_row_where(blind: Sequence[bool], values: torch.Tensor) -> torch.Tensor:
    """``values [B, rows, K, ...]`` with column 0 of each flagged (slot, row) replaced by the slot's first row's."""
    if not any(blind):
        return values
    slots, rows = values.shape[:2]
    flags = to_device(blind, values.device, torch.bool).view(slots, rows, 1, 1)
    return torch.cat([torch.where(flags, values[:, :1, :1], values[:, :, :1]), values[:, :, 1:]], dim=2)


@torch.no_grad()
def reference_logits(adapter: ModelAdapter, prompt: str, ids: torch.Tensor) -> torch.Tensor:
    """The oracle of :meth:`SlotBatch.forward`: the raw logits ``[rows, K + 1, V]`` after ``prompt`` of the body ids
    ``ids [K]`` (column ``j`` predicts the token after ``ids[:j]``), one full-sequence forward per CFG row, no cache.

    A row with an empty prompt sees only the body (positions from 0); the prediction of its first token, which has
    no context, is the first row's, as :meth:`SlotBatch.forward` defines it.
    """
    return _full_forward(adapter, adapter.decode_step, prompt, ids)


@torch.no_grad()
def reference_features(adapter: ModelAdapter, prompt: str, ids: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states ``[rows, K + 1, D]`` the logits of :func:`reference_logits` are computed from
    (``adapter.features_step``; the oracle of ``SlotBatch.forward(features=True)``, and the EAGLE head's training
    features)."""
    return _full_forward(adapter, adapter.features_step, prompt, ids)


def _full_forward(adapter: ModelAdapter, step: Callable[..., torch.Tensor], prompt: str, ids: torch.Tensor) -> torch.Tensor:
    """``step`` (the adapter's decode or features step) over each CFG row's prompt + ``ids``, the last ``K + 1``
    columns (an empty row's first column is the first row's)."""
    prompt_rows = list(adapter.prompt_inputs(prompt))
    body = adapter.body_inputs(ids.to(adapter.device).view(1, -1))[0]
    out = []
    for row in prompt_rows:
        sequence = torch.cat([row, body]).unsqueeze(0)
        n = sequence.shape[1]
        if n:
            values = step(sequence, None, torch.arange(n, device=adapter.device)[None], None)[0]
        if row.shape[0] == 0:  # no prompt: the first prediction is the first row's, then the body's own
            values = torch.cat([out[0][:1], values]) if n else out[0][:1]
        out.append(values[-(ids.numel() + 1):])
    return torch.stack(out)
