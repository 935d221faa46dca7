"""The one KV cache every run decodes on: a preallocated cache with a length per row (batch 1 is one slot).

``B`` images decode together, each at its own point of its image: slot ``b`` owns cache rows
``b * rows .. b * rows + rows - 1`` (``rows`` = 2 under CFG, conditional first) and every row has its
own length. Row ``r`` keeps its prompt from cache index 0 (no left padding), so cache index = position:
the ``q`` entries of a forward go to indices ``lengths[r] .. lengths[r] + q - 1``, which are also their
position ids, and an additive mask lets query ``j`` see keys ``0 .. lengths[r] + j`` and nothing else.
A row's numerics do not depend on the other rows' lengths (only CPU / GPU matrix products may round a row
differently for another number of rows: up to 2e-5 on the toy's logits); masked keys weigh exactly 0 (the
buffers start zeroed: no stale NaN leaks).

:class:`RaggedCache` is handed to a transformers decoder as ``cache=``: its attention layers call
:meth:`RaggedCache.update` and attend over what it returns; a 4D ``attention_mask`` bypasses the
library's mask construction. Nothing of the model code is copied. :class:`SlotBatch` drives an adapter
(``csd.adapters.base``: prompt inputs, body inputs, one decode step) on it: prefill a slot, one forward for every
slot's window, roll back or keep each slot's entries. :func:`reference_logits` is the no-cache oracle the tests
compare it with.

Compiled (``engine.compile=true``, ``csd.fast.CompiledStep``): the cache has a fixed capacity and its buffers
static addresses, kept across batches; the decode step is compiled, fed ``[B * rows, L]`` or ``[B * rows, 1]``
(the engine pads windows), so two graphs in all. Position ids, write indices and the mask are computed from the
device ``lengths`` outside the graph (inputs of fixed shape, copied into a CUDA graph's static inputs); prefill is
eager.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import PretrainedConfig

from csd.adapters.base import ModelAdapter
from csd.device import to_device
from csd.tree import TreeMask

if TYPE_CHECKING:
    from csd.fast import CompiledStep

#: default room after the prompt and the image body for the last window's (padded) rows
WINDOW_RESERVE = 64
#: default cache lengths are rounded up to a multiple of this, so that prompts of similar length share
#: one compiled cache (a new cache means new CUDA graphs: a recompilation)
CACHE_LEN_MULTIPLE = 256

#: a forward attends over the first ``2^k >= 128`` cache entries that hold every row's keys, not the whole
#: capacity: attention cost follows the batch's progress. Masked keys weigh exactly 0, and on the CPU
#: attention kernel results are bitwise equal for every power-of-two bound >= 128 (checked for the toy's
#: and tiny Janus's shapes), so a row's numerics still do not depend on its neighbours' lengths.
MIN_KEY_BOUND = 128


def default_cache_len(prompt_len: int, body_len: int) -> int:
    """Cache entries for a prompt of ``prompt_len`` entries, the body and ``WINDOW_RESERVE``, rounded up to
    ``CACHE_LEN_MULTIPLE``."""
    return math.ceil((prompt_len + body_len + WINDOW_RESERVE) / CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE


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
        #: ``[R, capacity]`` position id of every entry, kept from the first shifted forward on (``extend(shift=...)``;
        #: None before: every entry's position id is its index)
        self.key_pos: torch.Tensor | None = None
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
        if self.key_pos is not None:
            self.key_pos = torch.cat([self.key_pos, torch.arange(self.capacity, capacity, device=self.device).repeat(self.rows, 1)], 1)
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

    def extend(self, rows: slice, q: int, advance: Sequence[bool] | None = None, tree: TreeMask | None = None,
               shift: torch.Tensor | None = None, groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reserve ``q`` entries on each of ``rows`` for the next forward; returns its ``position_ids [A, q]`` and
        additive ``attention_mask [A, 1, q, bound]`` (0 where key ``k <= lengths[r] + j``, dtype min elsewhere;
        ``bound``: :func:`key_bound` of the advancing rows' new lengths, the whole capacity when ``fixed``).
        ``tree`` (a tree window, ``csd.tree``): entry ``j`` still goes to index ``lengths[r] + j``, but its position
        id is ``lengths[r] + depth[j]`` and it sees the prefix, its ancestors and itself only. ``shift [A, q]`` (windows
        that write in another order than their positions: ZipAR, docs/ALGORITHMS.md "ZipAR"): entry ``j`` still goes to
        index ``lengths[r] + j``, its position id is ``lengths[r] + j + shift[r, j]``, and it sees exactly the entries
        written so far (this window's included) whose position id is at most its own. Once a forward was shifted the
        cache keeps every entry's position id (``key_pos``). ``groups [A, q]`` (with ``shift``; several chains in one
        window: PJD's row-causal mask, docs/ALGORITHMS.md "PJD"): inside the window, entry ``j`` sees entry ``i`` only
        if ``groups[i]`` is 0 (a committed token, context for every chain) or equals ``groups[j]``.

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
            positions = self.lengths[rows, None] + tree.depth
        elif shift is not None:
            positions = positions + shift
        if shift is not None or self.key_pos is not None:
            self._record_positions(rows, write, positions)
        mask = self._mask(rows, q, positions, tree, shift is not None, groups)
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

    def _mask(self, rows: slice, q: int, positions: torch.Tensor, tree: TreeMask | None, shifted: bool,
              groups: torch.Tensor | None) -> torch.Tensor:
        """The additive mask ``[A, q, bound]`` of :meth:`extend` (before ``lengths`` advance)."""
        if tree is not None:
            visible = tree.visible(self.lengths[rows], self._bound)
        elif shifted:  # the entries written so far whose position id is at most the query's
            keys = torch.arange(self._bound, device=self.device)
            written = keys < (self.lengths[rows] + q)[:, None]
            visible = written[:, None, :] & (self.key_pos[rows, : self._bound][:, None, :] <= positions[:, :, None])
            if groups is not None:  # inside the window: shared entries (group 0) and the query's own group only
                rel = keys - self.lengths[rows, None]
                inside = (rel >= 0) & (rel < q)
                key_group = groups.gather(1, rel.clamp(0, q - 1))
                same = (key_group[:, None, :] == groups[:, :, None]) | (key_group == 0)[:, None, :]
                visible &= ~inside[:, None, :] | same
        elif self.fixed:
            visible = torch.arange(self._bound, device=self.device) <= positions[:, :, None]
        else:  # the same values, read from a table: one gather instead of four kernels per forward
            return self.causal_masks()[:, : self._bound][positions]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~visible, torch.finfo(self.dtype).min)

    def _record_positions(self, rows: slice, write: torch.Tensor, positions: torch.Tensor) -> None:
        """Keep the position ids ``positions [A, q]`` of the entries written at ``write [A, q]`` (from the first shifted
        forward on; the entries written before it have position id = index)."""
        if self.key_pos is None:
            self.key_pos = torch.arange(self.capacity, device=self.device).repeat(self.rows, 1)
        index = torch.arange(positions.shape[0], device=self.device)[:, None]
        self.key_pos[rows][index, write] = positions

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
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._active != slice(0, self.rows):
            keys, values = keys[self._active], values[self._active]
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
                if self.key_pos is not None:
                    self.key_pos[r, start + dst] = self.key_pos[r, start + src]
        self.rollback([q - len(keep) if r in rows else 0 for r in range(self.rows)])

    def rollback(self, n: Sequence[int]) -> None:
        """Drop the last ``n[r]`` entries of each row ``r`` (their stale keys stay, masked out, until overwritten)."""
        if len(n) != self.rows:
            raise ValueError(f"rollback needs one count per cache row ({self.rows}), got {len(n)}")
        for r, k in enumerate(n):
            if not 0 <= k <= max(self.filled[r], 0):  # a row without a prompt holds -1 entries before its first window
                raise ValueError(f"cannot roll back {k} of the {self.filled[r]} entries of cache row {r}")
        self.filled = [f - k for f, k in zip(self.filled, n, strict=True)]
        if len(set(n)) == 1:  # every row by the same count (batch 1's CFG rows): no host-to-device copy
            self.lengths -= n[0]
        else:
            self.lengths -= to_device(n, self.device)


class SlotBatch:
    """``slots`` images decoding at once on one :class:`RaggedCache` through an adapter's decode step.

    The adapter (``csd.adapters.base.ModelAdapter``) gives ``prompt_inputs(prompt)`` (model inputs of the CFG rows
    of a prompt: a ``[rows, T, ...]`` tensor, or one ``[T_r, ...]`` tensor per row when their lengths differ; a row
    may be empty), ``body_inputs(ids [N, K]) -> [N, K, ...]``, ``decode_step(inputs, cache, position_ids,
    attention_mask) -> [N, q, V]`` and ``decoder()`` (the transformers decoder whose layers the cache serves).
    Eager (``compiled`` None): the cache grows with the prompts. Compiled: the cache of ``compiled``, fixed.
    """

    def __init__(self, adapter: ModelAdapter, slots: int, compiled: CompiledStep | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots={slots} must be >= 1")
        self.adapter, self.slots, self.compiled = adapter, slots, compiled
        self.rows = 2 if adapter.uses_cfg else 1
        decoder = adapter.decoder()
        #: eager: sized by the first prompts and grown as needed; compiled: picked by the first prefill
        self.cache = None if compiled else RaggedCache(decoder.config, slots * self.rows, 0, decoder.dtype, decoder.device)
        #: ``[slots * rows, 1, ...]`` model input of each row's last prompt token (ids or embeddings)
        self.prompt_tail: torch.Tensor | None = None
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
                groups: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One forward of every slot's window ``ids [B, K]`` (column 0 the anchor; the prompt's last token where
        ``from_prompt``): raw logits ``[B, rows, K, V]``, row for row those of :func:`reference_logits`. Inactive
        slots' caches do not advance and their logits are meaningless. A row with an empty prompt has no context for
        its placeholder anchor's prediction: that column is the slot's first row's (under CFG: the prediction is
        unguided). ``tree``: every slot's window is that tree (``RaggedCache.extend``; eager only). ``features``:
        also return the decoder's last hidden states ``[B, rows, K, D]`` the logits were computed from
        (``logits = adapter.head(features)``, the same forward), as ``(logits, features)``. ``shift [B, K]``: each
        slot's position-id shifts and ``groups [B, K]`` its entries' chains (``RaggedCache.extend``; eager only)."""
        slots, k = ids.shape
        if slots != self.slots or self.prompt_tail is None:
            raise ValueError(f"forward needs ids for all {self.slots} slots after a prefill, got {slots}")
        if tree is not None and not self.tree_attention:
            raise ValueError("tree windows run on the eager cache: engine.compile must be false")
        if shift is not None and self.compiled is not None:
            raise ValueError("shifted position ids run on the eager cache: engine.compile must be false")
        rows = self.rows
        inputs = self.adapter.body_inputs(ids.to(self.cache.device).repeat_interleave(rows, dim=0))
        anchors = to_device(from_prompt, inputs.device, torch.bool).repeat_interleave(rows)
        anchors = anchors.view(-1, *[1] * (inputs.dim() - 1))
        inputs[:, :1] = torch.where(anchors, self.prompt_tail, inputs[:, :1])
        advance = [a for a in active for _ in range(rows)]
        if tree is not None:  # a tree's nodes may reach past the body by its siblings: room beyond the reserve
            self.cache.grow(max(self.cache.filled) + k)
        if shift is not None:
            shift = shift.to(self.cache.device).repeat_interleave(rows, dim=0)
        if groups is not None:
            groups = groups.to(self.cache.device).repeat_interleave(rows, dim=0)
        position_ids, mask = self.cache.extend(slice(0, self.cache.rows), k, advance, tree, shift, groups)
        self.ran = list(active)
        hidden = None
        if features:
            hidden = self.adapter.features_step(inputs, self.cache, position_ids, mask)
            logits = self.adapter.head(hidden)
        elif self.compiled is None:
            logits = self.adapter.decode_step(inputs, self.cache, position_ids, mask)
        else:  # the compiled step: one graph per window length K (1 or the engine's padded L)
            logits = self.compiled(inputs.contiguous(), self.cache, position_ids, mask)
        blind = [first and empty for first, row in zip(from_prompt, range(0, self.cache.rows, rows), strict=True)
                 for empty in self.no_prompt[row : row + rows]]
        logits = _first_row_where(blind, logits.view(slots, rows, k, -1))
        if hidden is None:
            return logits
        return logits, _first_row_where(blind, hidden.view(slots, rows, k, -1))

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
