"""Batched decoding on one preallocated KV cache with a length per row (docs/ALGORITHMS.md "Batches: ragged rows on one loop").

``B`` images decode together, each at its own point of its image: slot ``b`` owns cache rows
``b * rows .. b * rows + rows - 1`` (``rows`` = 2 under CFG, conditional first) and every row has its
own length. Row ``r`` keeps its prompt from cache index 0 (no left padding), so cache index = position:
the ``q`` entries of a forward go to indices ``lengths[r] .. lengths[r] + q - 1``, which are also their
position ids, and an additive mask lets query ``j`` see keys ``0 .. lengths[r] + j`` and nothing else.
Every forward attends over the whole capacity, so a row's numerics never depend on the other rows'
lengths (only CPU / GPU matrix products may round a row differently for another number of rows: up to
2e-5 on the toy's logits); masked keys weigh exactly 0 (the buffers start zeroed: no stale NaN leaks).

:class:`RaggedCache` is handed to a transformers Llama as ``cache=``: its attention layers call
:meth:`RaggedCache.update` and attend over what it returns; a 4D ``attention_mask`` bypasses the
library's mask construction. Nothing of the model code is copied. :class:`RaggedDispatch` implements
the adapter's batched API (``start_batch``, ``prefill_slot``, ``forward_batch``, ``rollback_batch``,
see ``csd.adapters.base``) on it for the toy, Janus, Lumina-mGPT and Emu3 adapters (the last two eager only,
their CFG rows at their own prompt lengths).

Compiled (``engine.compile=true``, the adapter's ``csd.fast.StaticDecoder``): the cache has a fixed
capacity and its buffers static addresses, kept on the adapter across batches; the decode step is the
StaticDecoder's compiled function, fed ``[B * rows, L]`` or ``[B * rows, 1]`` (the engine pads windows),
so two graphs in all. Position ids, write indices and the mask are computed from the device ``lengths``
outside the graph (inputs of fixed shape, copied into a CUDA graph's static inputs); prefill is eager.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig

from csd.adapters.base import BodyLayout, to_device
from csd.fast import StaticDecoder, default_cache_len
from csd.tree import TreeMask

#: a forward attends over the first ``2^k >= 128`` cache entries that hold every row's keys, not the whole
#: capacity: attention cost follows the batch's progress. Masked keys weigh exactly 0, and on the CPU
#: attention kernel results are bitwise equal for every power-of-two bound >= 128 (checked for the toy's
#: and tiny Janus's shapes), so a row's numerics still do not depend on its neighbours' lengths.
MIN_KEY_BOUND = 128


def key_bound(needed: int, capacity: int) -> int:
    """The number of cache entries a forward attends over: the power of two >= max(``needed``, 128), at most ``capacity``."""
    return min(capacity, max(MIN_KEY_BOUND, 1 << max(needed - 1, 0).bit_length()))


class RaggedCache:
    """Per-layer key/value buffers ``[R, kv_heads, capacity, head_dim]`` and a length per row.

    Protocol: :meth:`extend` before each forward (it picks the rows the forward runs on and returns their
    position ids and attention mask), then the model's layers call :meth:`update`. ``lengths`` lives on the
    device (positions and masks are built without a host sync); ``filled`` mirrors it on the host for the
    bounds checks. ``fixed``: the capacity never grows and the buffers are marked as static addresses
    (a CUDA graph writes into them in place, no copy).
    """

    def __init__(self, config: PretrainedConfig, rows: int, capacity: int, dtype: torch.dtype,
                 device: torch.device, fixed: bool = False) -> None:
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_layers = config.num_hidden_layers
        self.rows, self.dtype, self.device = rows, dtype, torch.device(device)
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.grow(capacity)
        self.fixed = fixed
        if fixed:
            for buffer in self.keys + self.values:
                torch._dynamo.mark_static_address(buffer)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.filled = [0] * rows
        self._active = slice(0, rows)
        self._bound = capacity
        self._write = self._row_index = torch.zeros(0, dtype=torch.long, device=self.device)
        #: eager forwards whose rows all write at one host-known start: the entries' slice (a copy, no index kernels)
        self._span: slice | None = None
        #: eager causal masks: row ``p`` is the additive mask of a query at position ``p`` (built on first use)
        self._causal: torch.Tensor | None = None

    def grow(self, capacity: int) -> None:
        """Enlarge every buffer to ``capacity`` entries per row, keeping its content (new entries zeroed)."""
        if capacity <= self.capacity:
            return
        shape = (self.rows, self.kv_heads, capacity, self.head_dim)
        old = self.keys + self.values
        new = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2 * self.num_layers)]
        for src, dst in zip(old, new[:len(old)], strict=True):
            dst[:, :, :self.capacity] = src
        self.keys, self.values = new[:self.num_layers], new[self.num_layers:]
        self.capacity = capacity

    def reset(self, rows: slice, no_prompt: Sequence[bool] | None = None) -> None:
        """Empty ``rows`` (a new prompt starts at cache index 0). A row flagged in ``no_prompt`` starts at length
        -1: its next entry, a placeholder anchor, gets position -1 (it sees no key) and index -1, the last
        entry, which a query attends only after the row's own token there has rewritten it; the row's first
        real token then gets index and position 0."""
        indices = range(*rows.indices(self.rows))
        starts = [0] * len(indices) if no_prompt is None else [-int(empty) for empty in no_prompt]
        self.lengths[rows] = to_device(starts, self.device)
        for r, start in zip(indices, starts, strict=True):
            self.filled[r] = start

    def extend(self, rows: slice, q: int, advance: Sequence[bool] | None = None,
               tree: TreeMask | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reserve ``q`` entries on each of ``rows`` for the next forward; returns its ``position_ids [A, q]`` and
        additive ``attention_mask [A, 1, q, bound]`` (0 where key ``k <= lengths[r] + j``, dtype min elsewhere;
        ``bound``: :func:`key_bound` of the advancing rows' new lengths, the whole capacity when ``fixed``).
        ``tree`` (a tree window, ``csd.tree``): entry ``j`` still goes to index ``lengths[r] + j``, but its position
        id is ``lengths[r] + depth[j]`` and it sees the prefix, its ancestors and itself only.

        Rows not flagged in ``advance`` (default: all flagged) keep their length: their entries are written
        past it (clamped to the last one, so a full row may lose its last entry) and never attended to.
        """
        indices = range(*rows.indices(self.rows))
        advance = [True] * len(indices) if advance is None else list(advance)
        for r, grows in zip(indices, advance, strict=True):
            if grows and self.filled[r] + q > self.capacity:
                raise ValueError(
                    f"cache overflow: row {r} holds {self.filled[r]} + {q} entries > capacity {self.capacity}"
                    + ("; raise engine.max_cache_len" if self.fixed else "")
                )
        positions = (self.lengths[rows, None] + torch.arange(q, device=self.device)).clamp(max=self.capacity - 1)
        needed = max((self.filled[r] + q for r, grows in zip(indices, advance, strict=True) if grows), default=q)
        self._bound = self.capacity if self.fixed else key_bound(needed, self.capacity)
        write = positions
        if tree is not None:
            visible = tree.visible(self.lengths[rows], self._bound)
            positions = self.lengths[rows, None] + tree.depth
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        elif self.fixed:
            visible = torch.arange(self._bound, device=self.device) <= positions[:, :, None]
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        else:  # the same values, read from a table: one gather instead of four kernels per forward
            mask = self.causal_masks()[positions][:, :, : self._bound]
        starts = {self.filled[r] for r in indices}
        same_start = len(starts) == 1 and min(starts) >= 0 and all(advance)
        self._span = slice(min(starts), min(starts) + q) if same_start and tree is None and not self.fixed else None
        self._active, self._write = rows, write
        if len(self._row_index) != positions.shape[0]:
            self._row_index = torch.arange(positions.shape[0], device=self.device)[:, None]
        if all(advance):
            self.lengths[rows] += q
        else:
            self.lengths[rows] += q * to_device(advance, self.device)
        for r, grows in zip(indices, advance, strict=True):
            self.filled[r] += q * grows
        return positions, mask.unsqueeze(1)

    def causal_masks(self) -> torch.Tensor:
        """``[capacity, capacity]`` additive masks: row ``p`` is 0 for keys ``k <= p``, dtype min after."""
        if self._causal is None or self._causal.shape[0] != self.capacity:
            keys = torch.arange(self.capacity, device=self.device)
            self._causal = torch.zeros((self.capacity, self.capacity), dtype=self.dtype, device=self.device)
            self._causal.masked_fill_(keys[None, :] > keys[:, None], torch.finfo(self.dtype).min)
        return self._causal

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a layer's new ``[A, H, q, D]`` keys/values at the reserved positions; return the active rows'
        first ``bound`` entries ``[A, H, bound, D]`` (the transformers ``Cache.update`` contract)."""
        keys = self.keys[layer_idx][self._active]
        values = self.values[layer_idx][self._active]
        if self._span is not None:
            keys[:, :, self._span] = key_states
            values[:, :, self._span] = value_states
        else:
            keys[self._row_index, :, self._write] = key_states.transpose(1, 2)
            values[self._row_index, :, self._write] = value_states.transpose(1, 2)
        return keys[:, :, : self._bound], values[:, :, : self._bound]

    def compact(self, rows: Sequence[int], q: int, keep: Sequence[int]) -> None:
        """After a forward of ``q`` entries on ``rows``: move its entries ``keep`` (increasing window indices, the
        first 0) to the front of the window and drop the others. A tree window keeps its root and accepted path;
        their position ids already were the path's, so the moved keys are exact (docs/ALGORITHMS.md "SJD-PAC: tree windows")."""
        keep = list(keep)
        if keep != list(range(len(keep))):
            src, dst = to_device(keep, self.device), torch.arange(len(keep), device=self.device)
            for r in rows:
                start = self.filled[r] - q
                for buffer in self.keys + self.values:
                    buffer[r, :, start + dst] = buffer[r, :, start + src]
        self.rollback([q - len(keep) if r in rows else 0 for r in range(self.rows)])

    def rollback(self, n: Sequence[int]) -> None:
        """Drop the last ``n[r]`` entries of each row ``r`` (their stale keys stay, masked out, until overwritten)."""
        if len(n) != self.rows:
            raise ValueError(f"rollback needs one count per cache row ({self.rows}), got {len(n)}")
        for r, k in enumerate(n):
            if not 0 <= k <= max(self.filled[r], 0):  # a row without a prompt holds -1 entries before its first window
                raise ValueError(f"cannot roll back {k} of the {self.filled[r]} entries of cache row {r}")
        self.filled = [f - k for f, k in zip(self.filled, n, strict=True)]
        self.lengths -= to_device(n, self.device)


@dataclass
class RaggedBatch:
    """The state of ``slots`` concurrent images: the cache (static path: picked by the first prefill), each
    row's prompt tail (the first anchor) and which slots the last forward advanced."""

    cache: RaggedCache | None
    slots: int
    rows: int
    #: ``[slots * rows, 1, ...]`` model input of each row's last prompt token (ids or embeddings); set by prefill
    prompt_tail: torch.Tensor | None = None
    ran: list[bool] = field(default_factory=list)
    #: per cache row: its prompt is empty (its anchor is a placeholder that predicts nothing); set by prefill
    no_prompt: list[bool] = field(default_factory=list)

    def slot_rows(self, slot: int) -> slice:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot={slot} must be in [0, {self.slots})")
        return slice(slot * self.rows, (slot + 1) * self.rows)


class RaggedDispatch:
    """Adapter mixin: the batched API of ``csd.adapters.base`` on a :class:`RaggedCache`.

    The adapter provides ``prompt_inputs(prompt)`` (model inputs of the CFG rows of a prompt: a
    ``[rows, T, ...]`` tensor, or one ``[T_r, ...]`` tensor per row when their lengths differ; a row may be
    empty), ``body_inputs(ids [N, K]) -> [N, K, ...]`` (model inputs of body token ids),
    ``decode_step(inputs, cache, position_ids, attention_mask) -> [N, q, V]``, ``decoder()`` (the
    transformers decoder whose layers the cache serves) and ``static`` (None: eager, growing cache).
    """

    static: StaticDecoder | None
    layout: BodyLayout
    uses_cfg: bool
    #: static path: the fixed-capacity cache of the last batch, reused by the next one of the same size (new
    #: buffers would re-record the CUDA graphs); one batch decodes on an adapter at a time
    fixed_cache: RaggedCache | None = None

    def start_batch(self, slots: int) -> Any:
        """A cache for ``slots`` images of ``rows`` CFG rows; its capacity is set by the first prompts. With the
        static (compiled) cache, one image decodes on the StaticDecoder's single context (``csd.fast``)."""
        if slots < 1:
            raise ValueError(f"slots={slots} must be >= 1")
        if self.static is not None and slots == 1:
            return super().start_batch(slots)
        rows = 2 if self.uses_cfg else 1
        if self.static is not None:
            return RaggedBatch(None, slots, rows, ran=[False] * slots)
        decoder = self.decoder()
        cache = RaggedCache(decoder.config, slots * rows, 0, decoder.dtype, decoder.device)
        return RaggedBatch(cache, slots, rows, ran=[False] * slots)

    def _static_cache(self, rows: int, prompt_len: int) -> RaggedCache:
        """The fixed cache of ``rows`` rows, ``engine.max_cache_len`` entries (else sized for ``prompt_len``),
        emptied; the previous one when it has this shape."""
        capacity = self.static.cache_len_for(prompt_len)
        cache = self.fixed_cache
        if cache is None or (cache.rows, cache.capacity) != (rows, capacity):
            self.fixed_cache = None  # free the old buffers first
            decoder = self.decoder()
            cache = RaggedCache(decoder.config, rows, capacity, decoder.dtype, decoder.device, fixed=True)
            self.fixed_cache = cache
        cache.reset(slice(0, rows))
        return cache

    @torch.no_grad()
    def prefill_slot(self, state: Any, slot: int, prompt: str) -> None:
        """(Re)start ``slot``: each row holds every token of its own prompt but the last, kept as the row's first
        anchor. Rows of different prompt lengths prefill in one forward, right-padded to the longest (the
        padding lands past each row's length and is rolled back); a row with an empty prompt gets a placeholder
        anchor that no query sees (``RaggedCache.reset``), whose prediction :meth:`forward_batch` replaces.

        Eager path: the cache grows (other rows keep their entries) when the prompt plus the image body and a
        window reserve do not fit (``csd.fast.default_cache_len``). Static path: the batch's first prompt
        picks the fixed capacity (``engine.max_cache_len`` when set); a later prompt must fit it.
        """
        if not isinstance(state, RaggedBatch):
            return super().prefill_slot(state, slot, prompt)
        rows = state.slot_rows(slot)
        inputs = list(self.prompt_inputs(prompt))
        lengths = [row.shape[0] for row in inputs]
        prompt_len, body_len = max(lengths) - 1, self.layout.length
        if self.static is None:
            state.cache.grow(default_cache_len(prompt_len, body_len))
        else:
            if state.cache is None:
                state.cache = self._static_cache(state.slots * state.rows, prompt_len)
            if prompt_len + body_len > state.cache.capacity:
                raise ValueError(
                    f"a prompt of {prompt_len} cache entries plus a body of {body_len} does not fit the batched "
                    f"cache of {state.cache.capacity} entries; raise engine.max_cache_len"
                )
        tails = torch.stack([row[-1] if n else row.new_zeros(row.shape[1:]) for row, n in zip(inputs, lengths, strict=True)])
        if state.prompt_tail is None:
            state.prompt_tail = tails.new_zeros((state.cache.rows, 1, *tails.shape[1:]))
            state.no_prompt = [False] * state.cache.rows
        state.prompt_tail[rows] = tails.unsqueeze(1)
        state.no_prompt[rows] = [n == 0 for n in lengths]
        state.cache.reset(rows, state.no_prompt[rows])
        if prompt_len > 0:
            body = torch.nn.utils.rnn.pad_sequence([row[:-1] for row in inputs], batch_first=True)
            position_ids, mask = state.cache.extend(rows, prompt_len, [n > 0 for n in lengths])
            self.decode_step(body, state.cache, position_ids, mask)
            padding = [0] * state.cache.rows
            padding[rows] = [prompt_len + 1 - n if n else 0 for n in lengths]
            if any(padding):
                state.cache.rollback(padding)

    @property
    def tree_attention(self) -> bool:
        """Tree windows (``forward_batch(tree=...)``, :meth:`keep_batch`) run on the eager cache."""
        return self.static is None

    @torch.no_grad()
    def forward_batch(self, state: Any, ids: torch.Tensor, from_prompt: Sequence[bool],
                      active: Sequence[bool], tree: TreeMask | None = None) -> torch.Tensor:
        """One forward of every slot's window ``ids [B, K]``: raw logits ``[B, rows, K, V]``, row for row those
        of the single-context ``forward`` (column 0 is the anchor; the prompt tail where ``from_prompt``).
        Inactive slots' caches do not advance and their logits are meaningless. A row with an empty prompt
        has no context for its placeholder anchor's prediction: that column is the slot's first row's (under
        CFG: the prediction is unguided). ``tree``: every slot's window is that tree (``RaggedCache.extend``)."""
        if not isinstance(state, RaggedBatch) or (tree is not None and self.static is not None):
            return super().forward_batch(state, ids, from_prompt, active, tree)
        slots, k = ids.shape
        if slots != state.slots or state.prompt_tail is None:
            raise ValueError(f"forward_batch needs ids for all {state.slots} slots after a prefill, got {slots}")
        rows = state.rows
        inputs = self.body_inputs(ids.to(state.cache.device).repeat_interleave(rows, dim=0))
        anchors = to_device(from_prompt, inputs.device, torch.bool).repeat_interleave(rows)
        anchors = anchors.view(-1, *[1] * (inputs.dim() - 1))
        inputs[:, :1] = torch.where(anchors, state.prompt_tail, inputs[:, :1])
        advance = [a for a in active for _ in range(rows)]
        if tree is not None:  # a tree's nodes may reach past the body by its siblings: room beyond the reserve
            state.cache.grow(max(state.cache.filled) + k)
        position_ids, mask = state.cache.extend(slice(0, state.cache.rows), k, advance, tree)
        state.ran = list(active)
        if self.static is None:
            logits = self.decode_step(inputs, state.cache, position_ids, mask)
        else:  # the compiled step: one graph per window length K (1 or the engine's padded L)
            logits = self.static.call(inputs.contiguous(), state.cache, position_ids, mask)
        logits = logits.view(slots, rows, k, -1)
        blind = [first and empty for first, row in zip(from_prompt, range(0, state.cache.rows, rows), strict=True)
                 for empty in state.no_prompt[row : row + rows]]
        if any(blind):
            blind = to_device(blind, logits.device, torch.bool).view(slots, rows, 1, 1)
            logits = torch.cat([torch.where(blind, logits[:, :1, :1], logits[:, :, :1]), logits[:, :, 1:]], dim=2)
        return logits

    def keep_batch(self, state: Any, q: int, keep: Sequence[Sequence[int]]) -> None:
        """After a tree forward of ``q`` entries, for each slot it advanced: keep the entries ``keep[b]`` (window
        indices: the root and the accepted path) at the front of its window and drop the rest."""
        if not isinstance(state, RaggedBatch):
            return super().keep_batch(state, q, keep)
        for slot, (nodes, ran) in enumerate(zip(keep, state.ran, strict=True)):
            if ran:
                rows = state.slot_rows(slot)
                state.cache.compact(range(rows.start, rows.stop), q, nodes)

    def rollback_batch(self, state: Any, n: Sequence[int]) -> None:
        """Drop the last ``n[b]`` entries of every row of slot ``b``, for each slot the last forward advanced."""
        if not isinstance(state, RaggedBatch):
            return super().rollback_batch(state, n)
        if len(n) != state.slots:
            raise ValueError(f"rollback_batch needs one count per slot ({state.slots}), got {len(n)}")
        state.cache.rollback([int(k) * ran for k, ran in zip(n, state.ran, strict=True) for _ in range(state.rows)])
