"""What each query of a spatial drafter's forward attends to, read from the attention masks the cache builds, against
the drafters' definitions (docs/ALGORITHMS.md "PJD", "ZipAR").

A shadow of the cache (:class:`KeyLedger`) labels every entry the engine writes with its body position and token id
(prompt entries by position), follows the cache's compactions, roll-backs and refills, and reads, for every query of
every forward, the labels of the keys its additive mask leaves open. The definition:

- PJD: a query at body position ``P`` sees every committed cell before ``P`` (with its committed token), the prompt,
  and its own row's chain up to ``P`` (its anchor, a proxy included, and its earlier drafts); nothing else, and no key
  twice. A query that is no chain's (a completion entry, a left-out row's latest cell) sees the committed cells
  before it and itself.
- ZipAR: a query at position ``P`` sees every cell committed before its forward at a position before ``P``, the
  prompt and itself (a proxy: its source cell's token at ``P``).

The case the definition is explicit about: a lower row with ``K < 2`` (left out of the forward's chains) whose latest
committed cell must still be visible to the rows below it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from csd.acceptance import SJD
from csd.adapters.emu3 import tiny_emu3_adapter
from csd.adapters.janus import tiny_janus_adapter
from csd.adapters.lumina import tiny_lumina_adapter
from csd.cache import RaggedCache
from csd.drafters.pjd import PJDDrafter
from csd.drafters.zipar import PROMPT_TAIL, ZipARDrafter, zipar_schedule
from csd.engine import JacobiEngine
from csd.ragged import SlotBatch
from csd.slot import Request
from tests.helpers import rejecting_anole, rejecting_janus, rejecting_llamagen

#: the token label of a prompt entry (token ids are >= 0)
PROMPT = -1

Label = tuple[int, int]


class KeyLedger:
    """A shadow of the engine's :class:`RaggedCache`: per cache row, the label ``(body position, token id)`` of every
    entry it holds (``PROMPT`` for prompt entries, the prompt's last token at body position -1), and per forward, per
    cache row, per query, the sorted labels of the keys its mask leaves open (``forwards``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        #: per cache row: ``(position id, token)`` of each entry, by cache index + ``offset`` (1 on a row without a
        #: prompt, whose placeholder anchor sits at index -1: :meth:`RaggedCache.reset`)
        self.entries: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.offset: dict[int, int] = defaultdict(int)
        #: per cache row: the position id of body position 0 (the prompt's length)
        self.base: dict[int, int] = {}
        self.feeding: tuple[list[list[int]], list[bool]] | None = None
        #: per forward: {cache row: (its prompt's labels, [visible labels of query j])}
        self.forwards: list[dict[int, tuple[set[Label], list[list[Label]]]]] = []
        ledger = self
        extend, compact, rollback, reset = RaggedCache.extend, RaggedCache.compact, RaggedCache.rollback, RaggedCache.reset
        prefill, forward = SlotBatch.prefill, SlotBatch.forward

        def ledger_extend(cache, rows, q, advance=None, tree=None, shift=None, groups=None):
            indices = range(*rows.indices(cache.rows))
            grows = [True] * len(indices) if advance is None else list(advance)
            starts = [cache.filled[r] for r in indices]
            positions, mask = extend(cache, rows, q, advance, tree, shift, groups)
            seen: dict[int, tuple[set[Label], list[list[Label]]]] = {}
            for i, (r, start) in enumerate(zip(indices, starts, strict=True)):
                if not grows[i]:
                    continue
                assert len(ledger.entries[r]) == start + ledger.offset[r]
                for j in range(q):
                    if ledger.feeding is None:
                        token = PROMPT
                    else:
                        ids, anchored = ledger.feeding
                        token = PROMPT if j == 0 and anchored[r] else ids[r][j]
                    ledger.entries[r].append((int(positions[i, j]), token))
                if ledger.feeding is not None:
                    seen[r] = (ledger.prompt(r), [sorted(ledger.label(r, k) for k in (mask[i, 0, j] == 0).nonzero()[:, 0].tolist())
                                                  for j in range(q)])
            if ledger.feeding is not None:
                ledger.forwards.append(seen)
            return positions, mask

        def ledger_compact(cache, rows, q, keep):
            keep = list(keep)
            for r in rows:
                start = cache.filled[r] - q + ledger.offset[r]
                window = ledger.entries[r][start:]
                ledger.entries[r][start:] = [window[k] for k in keep] + [e for k, e in enumerate(window) if k not in keep]
            compact(cache, rows, q, keep)

        def ledger_rollback(cache, n):
            for r, k in enumerate(n):
                del ledger.entries[r][cache.filled[r] - k + ledger.offset[r] :]
            rollback(cache, n)

        def ledger_reset(cache, rows, no_prompt=None):
            for i, r in enumerate(range(*rows.indices(cache.rows))):
                ledger.entries[r] = []
                ledger.offset[r] = int(no_prompt is not None and no_prompt[i])
            reset(cache, rows, no_prompt)

        def ledger_prefill(batch, slot, prompt):
            prefill(batch, slot, prompt)
            for r in range(*batch.slot_rows(slot).indices(batch.cache.rows)):
                ledger.base[r] = batch.cache.filled[r] + 1

        def ledger_forward(batch, ids, from_prompt, active, *args, **kwargs):
            ledger.feeding = (ids.repeat_interleave(batch.rows, 0).tolist(),
                              [first for first in from_prompt for _ in range(batch.rows)])
            try:
                return forward(batch, ids, from_prompt, active, *args, **kwargs)
            finally:
                ledger.feeding = None

        monkeypatch.setattr(RaggedCache, "extend", ledger_extend)
        monkeypatch.setattr(RaggedCache, "compact", ledger_compact)
        monkeypatch.setattr(RaggedCache, "rollback", ledger_rollback)
        monkeypatch.setattr(RaggedCache, "reset", ledger_reset)
        monkeypatch.setattr(SlotBatch, "prefill", ledger_prefill)
        monkeypatch.setattr(SlotBatch, "forward", ledger_forward)

    def label(self, row: int, index: int) -> Label:
        position, token = self.entries[row][index + self.offset[row]]
        return position - self.base[row], token

    def prompt(self, row: int) -> set[Label]:
        """The prompt's labels on cache row ``row`` (body positions ``-n .. -1``)."""
        return {(p, PROMPT) for p in range(-self.base[row], 0)}


@dataclass
class Expected:
    """One slot's forward by the definition: per window entry (padding excluded), its body position and the labels
    it must see beside the prompt."""

    slot: int
    positions: list[int]
    visible: list[set[Label]]


@dataclass
class PJDRecorder:
    """Every PJD forward's :class:`Expected`, from the drafter's state at the proposal, and the forwards in which a
    lower row was left out (``K < 2``) while holding a committed latest cell and a row below it fed a chain
    (``left_out``: (forward, left-out grid row, body position of its latest cell))."""

    expected: list[list[Expected]] = field(default_factory=list)
    left_out: list[tuple[int, int, int]] = field(default_factory=list)
    #: per forward, per slot: committed cells per grid row at the proposal
    done: list[list[list[int] | None]] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        propose, recorder = PJDDrafter.propose, self

        def recording_propose(drafter, slots):
            proposal = propose(drafter, slots)
            recorder.record(drafter, slots, proposal)
            return proposal

        monkeypatch.setattr(PJDDrafter, "propose", recording_propose)

    def record(self, drafter: PJDDrafter, slots, proposal) -> None:
        forward, out, done = len(self.expected), [], []
        for b, (slot, plan) in enumerate(zip(slots, proposal.windows, strict=True)):
            if slot is None:
                done.append(None)
                continue
            state = slot.draft
            done.append(list(state.done))
            committed = {p: int(drafter.body(state.raster[p : p + 1], p)) for p, c in enumerate(state.committed) if c}
            ids = proposal.ids[b].tolist()
            positions = [s + state.cached + j - 1 for j, s in enumerate(proposal.shift[b, : plan.entries].tolist())]
            labels = [(p, PROMPT if p == -1 and proposal.from_prompt[b] and j == 0 else ids[j])
                      for j, p in enumerate(positions)]
            own = [{labels[j]} for j in range(plan.entries)]
            for chain in plan.chains:
                for i in range(chain.window.rows):
                    own[chain.offset + i] = set(labels[chain.offset : chain.offset + i + 1])
            in_chain = {chain.offset + i for chain in plan.chains for i in range(chain.window.rows)}
            for j in range(plan.entries):
                if j not in in_chain:  # context entries: committed tokens
                    assert committed.get(positions[j]) == ids[j], (forward, b, j, positions[j])
            visible = [{(p, t) for p, t in committed.items() if p < positions[j]} | own[j] for j in range(plan.entries)]
            out.append(Expected(b, positions, visible))
            fed = {chain.row.index for chain in plan.chains}
            for i, row in enumerate(state.rows[1:], start=1):
                latest = row.start - 1
                if (drafter._entries(state, i) < 2 and state.committed[latest]
                        and any(r.index > row.index and r.index in fed for r in state.rows)):
                    self.left_out.append((forward, row.index, latest))
        self.expected.append(out)
        self.done.append(done)


def check(ledger: KeyLedger, expected: list[list[Expected]], rows: int) -> int:
    """Every query's visible labels equal its expected ones (each key once); returns the queries checked."""
    assert len(ledger.forwards) == len(expected)
    checked = 0
    for t, (seen, slots) in enumerate(zip(ledger.forwards, expected, strict=True)):
        for e in slots:
            for r in range(e.slot * rows, (e.slot + 1) * rows):
                prompt, queries = seen[r]
                for j, want in enumerate(e.visible):
                    got, want = queries[j], (want - {(-1, PROMPT)}) | prompt  # (the placeholder of an empty prompt)
                    assert len(set(got)) == len(got), f"forward {t} slot {e.slot} row {r} query {j}: a key twice"
                    assert set(got) == want, (
                        f"forward {t}, slot {e.slot}, cache row {r}, query {j} at body position {e.positions[j]}: "
                        f"missing {sorted(want - set(got))}, extra {sorted(set(got) - want)}")
                    checked += 1
    return checked


def decode_pjd(adapter, drafter: PJDDrafter, requests: list[Request], batch_size: int, monkeypatch):
    ledger, recorder = KeyLedger(monkeypatch), PJDRecorder()
    recorder.install(monkeypatch)
    engine = JacobiEngine(adapter, SJD(), drafter, batch_size=batch_size)
    gens = dict(engine.generate_many(requests))
    monkeypatch.undo()
    return ledger, recorder, gens


def janus_pro_tiny():
    """``model=janus_pro_tiny`` (conf/model/janus_pro_tiny.yaml): 8 x 8, 64 codes, peaked targets."""
    return tiny_janus_adapter(grid=8, codebook=64, seed=0, head_scale=20.0, guidance_scale=5.0)


MODELS = {
    "janus_pro_tiny": janus_pro_tiny,
    "janus": lambda: rejecting_janus(grid=6, codebook=4),
    "lumina": lambda: tiny_lumina_adapter(grid=(5, 8), jacobi_tail=1, head_scale=20.0),
    "emu3": lambda: tiny_emu3_adapter(grid=(5, 8), head_scale=20.0),
    "anole": lambda: rejecting_anole(grid=(4, 5)),
    "llamagen": lambda: rejecting_llamagen("c2i"),
}
#: per model, requests (prompt, seed) of which the first has a left-out row with a row below drafting (found by a
#: scan of these tiny models; most images have none)
REQUESTS = {
    "janus_pro_tiny": [("a cat", 1), ("sky", 4), ("a dog", 2)],
    "lumina": [("red", 3), ("a cat", 1), ("sky", 4)],
    "emu3": [("sky", 4), ("a cat", 1), ("red", 3)],
    "llamagen": [("7", 0), ("3", 1), ("1", 2)],
}


@pytest.mark.parametrize(("model", "window", "context", "batch", "left_out"), [
    ("janus_pro_tiny", 3, 1, 1, True), ("janus_pro_tiny", 3, 2, 3, True), ("janus_pro_tiny", 4, 1, 3, True),
    ("lumina", 3, 1, 1, True), ("lumina", 3, 1, 3, True), ("emu3", 4, 2, 3, True),
    ("janus", 3, 1, 1, False), ("janus", 4, 2, 3, False), ("janus", 2, 1, 3, False),
    ("anole", 3, 1, 1, False), ("llamagen", 4, 1, 3, False),
])
def test_every_pjd_query_sees_the_committed_cells_before_it_and_its_own_chain(model, window, context, batch, left_out,
                                                                               monkeypatch):
    """Every forward of several images (batch 1, or batch 3 with refills: padded windows, slots at different points
    of their schedules), every CFG row, every query: raster bodies with proxies (Janus-Pro; Anole: CFG rows of
    different prompt lengths; LlamaGen: 2-D rotary), end-of-line anchors, headers and completion entries
    (Lumina-mGPT, with its empty unconditional prompt; Emu3). Where ``left_out``, some forward leaves a lower row out
    of the chains while it holds a committed latest cell and a row below it drafts (the case the definition is
    explicit about)."""
    adapter = MODELS[model]()
    pairs = REQUESTS.get(model, [("a cat", 0), ("a dog", 1), ("red", 2)])
    requests = [Request(p, seed, i) for i, (p, seed) in enumerate(pairs + pairs[:2] if batch > 1 else pairs[:2])]
    ledger, recorder, _ = decode_pjd(adapter, PJDDrafter(window=window, context=context), requests, batch, monkeypatch)
    rows = 2 if adapter.uses_cfg else 1
    assert check(ledger, recorder.expected, rows) > 0
    assert bool(recorder.left_out) == left_out


def test_a_left_out_rows_latest_cell_is_visible_to_the_rows_below(monkeypatch):
    """The reported case: ``model=janus_pro_tiny`` (8 x 8), SJD on PJD with window 3 and context 1, "a blue bird",
    seed 3. In forward 12 rows 4, 5 and 6 are in flight with [8, 8, 8, 8, 3, 2, 0, 0] committed cells; row 5 has
    ``K = 1`` (it stays one cell behind row 4) and feeds no chain, while row 6 drafts. Row 6's first draft (body
    position 48) must see row 5's latest cell (position 41), which row 5 will anchor its next chain on."""
    adapter = janus_pro_tiny()
    ledger, recorder, _ = decode_pjd(adapter, PJDDrafter(window=3, context=1), [Request("a blue bird", 3, 0)], 1,
                                     monkeypatch)
    assert recorder.done[12][0] == [8, 8, 8, 8, 3, 2, 0, 0]
    assert (12, 5, 41) in recorder.left_out
    (forward,) = recorder.expected[12]
    query = forward.positions.index(48)
    for r in (0, 1):  # both CFG rows
        assert 41 in {p for p, _ in ledger.forwards[12][r][1][query]}
    check(ledger, recorder.expected, 2)


@pytest.mark.parametrize(("grid", "window_size", "batch"), [(4, 1, 1), (5, 2, 3), (6, 3, 1)])
def test_every_zipar_query_sees_the_cells_committed_before_it(grid, window_size, batch, monkeypatch):
    """ZipAR's shared schedule has no left-out row: every forward feeds every cell the last one committed, and the
    cache keeps all but the proxies, so each query sees every earlier committed cell (and a proxy only itself)."""
    adapter = rejecting_janus(grid=grid, codebook=4)
    ledger = KeyLedger(monkeypatch)
    forwards = zipar_schedule(grid, grid, window_size)
    generation = {cell: g for g, cell in enumerate(c for f in forwards for c in f.commits)}
    expected: list[list[Expected]] = []
    propose = ZipARDrafter.propose

    def recording_propose(drafter, slots):
        proposal = propose(drafter, slots)
        out = []
        for b, slot in enumerate(slots):
            if slot is None:
                continue
            ids = drafter.body.image_ids[slot.body].tolist()
            committed = {cell: ids[g] for cell, g in generation.items() if g < slot.n}
            f = forwards[slot.iteration]
            token = [PROMPT if src == PROMPT_TAIL else committed[src] for src, _ in f.entries]
            positions = [pos for _, pos in f.entries]
            visible = [{(p, t) for p, t in committed.items() if p < positions[j]} | {(positions[j], token[j])}
                       for j in range(len(f.entries))]
            out.append(Expected(b, positions, visible))
        expected.append(out)
        return proposal

    monkeypatch.setattr(ZipARDrafter, "propose", recording_propose)
    requests = [Request(p, seed, seed) for seed, p in enumerate(["a cat", "a dog", "red", "sky"][: 4 if batch > 1 else 1])]
    dict(JacobiEngine(adapter, SJD(), ZipARDrafter(window_size=window_size), batch_size=batch).generate_many(requests))
    monkeypatch.undo()
    assert check(ledger, expected, 2) > 0
    assert any(f.proxies for f in forwards)
