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
library's mask construction. Nothing of the model code is copied. ``csd.ragged.SlotBatch`` drives an adapter on it.

Compiled (``engine.compile=true``, ``csd.fast.CompiledStep``): the cache has a fixed capacity and its buffers
static addresses, kept across batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from csd.device import to_device
from csd.tree import TreeMask

if TYPE_CHECKING:
    from transformers import PretrainedConfig


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
        self._check_room(indices, q, advance)
        positions = self._positions(rows, q)
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
        self.advance(rows, q, advance)
        return positions, mask.unsqueeze(1)

    def reserve(self, q: int, advance: Sequence[bool]) -> None:
        """:meth:`extend` of every row of a fixed cache, split for a compiled forward: the host half (the bounds check,
        the key bound, the write rows) here, then the forward's graph calls :meth:`feed` (positions, mask, write
        indices from the device ``lengths``), then :meth:`advance`. The same entries, positions and mask as
        :meth:`extend` (causal windows: no tree, shift or recorded positions)."""
        if not self.fixed or self.key_pos is not None:
            raise ValueError("reserve / feed serve a fixed cache without shifted positions; use extend")
        self._check_room(range(self.rows), q, advance)
        self._bound, self._span, self._active = self.capacity, None, slice(0, self.rows)
        if len(self._row_index) != self.rows:
            self._row_index = torch.arange(self.rows, device=self.device)[:, None]

    def feed(self, q: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inside the compiled forward, after :meth:`reserve`: every row's ``position_ids [R, q]`` and additive
        ``attention_mask [R, 1, q, capacity]`` of :meth:`extend`, computed from the device ``lengths`` (0 where key
        ``k <= position``, the dtype's minimum after: the causal table's rows, built in the graph instead of gathered
        from it), and the forward's write indices."""
        positions = self._positions(slice(0, self.rows), q)
        keys = torch.arange(self.capacity, device=self.device)
        mask = torch.zeros((self.rows, q, self.capacity), dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(keys > positions[:, :, None], torch.finfo(self.dtype).min)
        self._write = positions
        return positions, mask.unsqueeze(1)

    def advance(self, rows: slice, q: int, advance: Sequence[bool]) -> None:
        """After a forward of ``q`` entries on ``rows``: the rows flagged in ``advance`` hold them (``lengths`` on the
        device, ``filled`` on the host)."""
        if all(advance):
            (self.lengths if rows == slice(0, self.rows) else self.lengths[rows]).add_(q)  # every row: no view
        else:
            self.lengths[rows] += q * to_device(advance, self.device)
        for r, grows in zip(range(*rows.indices(self.rows)), advance, strict=True):
            self.filled[r] += q * grows

    def _check_room(self, indices: range, q: int, advance: Sequence[bool]) -> None:
        """A clear error before a forward of ``q`` entries that an advancing row has no room for."""
        for r, grows in zip(indices, advance, strict=True):
            if grows and self.filled[r] + q > self.capacity:
                raise ValueError(
                    f"cache overflow: row {r} holds {self.filled[r]} + {q} entries > capacity {self.capacity}"
                    + ("; raise engine.max_cache_len" if self.fixed else "")
                )

    def _positions(self, rows: slice, q: int) -> torch.Tensor:
        """``[A, q]`` the indices the next ``q`` entries of ``rows`` go to (clamped to the last entry: a row that does
        not advance writes past its length)."""
        return (self.lengths[rows, None] + torch.arange(q, device=self.device)).clamp(max=self.capacity - 1)

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
        else:  # causal: read from a table, one gather instead of four kernels per forward
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
