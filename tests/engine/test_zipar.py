"""ZipAR's spatial schedule (``drafter=zipar``, docs/ALGORITHMS.md "ZipAR").

The schedule against its definition written out by hand (a 3 x 2 grid) and its forward count; ``window_size >= W``
is AR token for token; every forward's logits equal one no-cache forward over the generation-ordered entries with
their raster position ids and ZipAR's visibility (each entry sees the entries fed up to its forward whose position
is at most its own; a proxy only in its own forward); the sequence law of a 3 x 2 image, enumerated from that
definition, against the engine's samples (chi-square), with AR's law as the negative control (a proxy at a wrong
position: the forward test's); a batch gives each image its batch-1 tokens; refusals in one line before any model
loads.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import astuple

import pytest
import torch

from csd.acceptance import SJD
from csd.adapters.base import BodyLayout
from csd.drafters.chain import ChainDrafter
from csd.drafters.zipar import PROMPT_TAIL, Forward, ZipARDrafter, zipar_schedule
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.processors import TargetPipeline
from csd.ragged import SlotBatch
from csd.slot import Request
from csd.validate import validate
from tests.helpers import (
    chi_square_pvalue,
    exact_sequence_distribution,
    make_cfg,
    rejecting_anole,
    rejecting_janus,
    rejecting_llamagen,
)

PROMPT = "a cat"
P = PROMPT_TAIL
#: ZipAR on a 3 x 2 grid with window_size 1 by its definition (cells in raster order): row 0 alone, row 1 once row 0
#: is complete, row 2 once row 1 has one token, its first token from a proxy (cell 1, the latest of row 0, fed at
#: the position of cell 3); per forward: entries (source cell, position cell), the entry predicting each committed
#: cell, those cells, the number of proxies (the last entries)
THREE_BY_TWO = [
    Forward(((P, P),), (0,), (0,), 0),
    Forward(((0, 0),), (0,), (1,), 0),
    Forward(((1, 1),), (0,), (2,), 0),
    Forward(((2, 2), (1, 3)), (0, 1), (3, 4), 1),
    Forward(((3, 3), (4, 4)), (1,), (5,), 0),
]


def test_the_schedule_is_its_definition():
    assert zipar_schedule(3, 2, 1) == THREE_BY_TWO
    for rows, cols, window in itertools.product((1, 2, 5), (1, 3, 7), (1, 2, 3, 8)):
        forwards = zipar_schedule(rows, cols, window)
        cells = [c for f in forwards for c in f.commits]
        assert sorted(cells) == list(range(rows * cols))
        # cell (r, c) is committed by forward c (row 0) or W + (r - 1) min(w, W) + c: 2W + (R - 2) w forwards
        when = {cell: t for t, f in enumerate(forwards) for cell in f.commits}
        start = min(window, cols)
        assert all(when[r * cols + c] == (c if r == 0 else cols + (r - 1) * start + c)
                   for r in range(rows) for c in range(cols))
    assert all(len(f.commits) == 1 for f in zipar_schedule(2, 9, 1))  # two rows: row 1 waits for row 0, so AR


@pytest.fixture(scope="module")
def janus():
    return rejecting_janus(grid=4, codebook=4)


def test_window_size_of_the_width_or_more_is_ar(janus):
    """One row at a time: each forward feeds the last token at its own position (shift 0, causal visibility) and draws
    a one-row window's random numbers, AR's exactly (``ZipARDrafter.verify``), so the tokens are AR's."""
    ar = JacobiEngine(janus, SJD(), ChainDrafter(window=1))
    for window in (4, 9):
        zipar = JacobiEngine(janus, SJD(), ZipARDrafter(window_size=window))
        a, z = ar.generate(PROMPT, window), zipar.generate(PROMPT, window)
        assert torch.equal(a.tokens, z.tokens) and torch.equal(a.entropy, z.entropy)
        assert torch.equal(a.commit_iter, z.commit_iter) and a.nfe == z.nfe == 16


def test_records_are_in_raster_order(janus):
    gen = JacobiEngine(janus, SJD(), ZipARDrafter(window_size=1)).generate(PROMPT, 0)
    assert gen.nfe == 2 * 4 + 2 * 1
    assert gen.commit_iter.view(4, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [5, 6, 7, 8], [6, 7, 8, 9]]
    assert set(gen.stats.values()) == {0}  # no drafts


def test_a_batch_gives_each_image_its_batch_1_tokens(janus):
    """Three slots at different points of the schedule (padded windows), refilled as images finish."""
    requests = [Request(prompt, seed, seed) for seed, prompt in enumerate(["a cat", "a dog", "red", "a cat", "sky"])]
    batched = dict(JacobiEngine(janus, SJD(), ZipARDrafter(window_size=2), batch_size=3).generate_many(requests))
    one = JacobiEngine(janus, SJD(), ZipARDrafter(window_size=2))
    for request, gen in batched.items():
        alone = one.generate(request.prompt, request.seed)
        assert torch.equal(gen.tokens, alone.tokens) and torch.equal(gen.commit_iter, alone.commit_iter)
        assert gen.nfe == alone.nfe == 2 * 4 + 2 * 2


@torch.no_grad()
def reference_entry_logits(adapter, prompt: str, forwards, tokens: dict[int, int]) -> torch.Tensor:
    """Raw logits ``[rows, E, V]`` of every entry of ``forwards`` (generation order), by ZipAR's definition: one
    no-cache forward per CFG row over the prompt and every entry (its source cell's token at its position cell's
    position id, prompt length + cell), where entry ``k`` is visible to entry ``j`` iff ``k`` was fed by ``j``'s
    forward or an earlier one, its position is at most ``j``'s, and it is no proxy of an earlier forward.
    ``tokens``: image code of each cell."""
    src, pos, fwd, proxy = [], [], [], []
    for t, f in enumerate(forwards):
        for j, (s, p) in enumerate(f.entries):
            src, pos, fwd, proxy = src + [s], pos + [p], fwd + [t], proxy + [j >= len(f.entries) - f.proxies]
    body = adapter.body_inputs(adapter.image_token_ids[torch.tensor([tokens[s] for s in src[1:]])].view(1, -1))[0]
    out = []
    for row in adapter.prompt_inputs(prompt):  # the prompt's last token is entry 0 (the first forward's anchor)
        n = row.shape[0]
        position = torch.tensor(list(range(n)) + [n + p for p in pos[1:]])
        forward = torch.tensor([0] * n + fwd[1:])
        stale = torch.tensor([False] * n + proxy[1:])
        visible = ((forward[None, :] <= forward[:, None]) & (position[None, :] <= position[:, None])
                   & (~stale[None, :] | (forward[None, :] == forward[:, None])))
        mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
        logits = adapter.decode_step(torch.cat([row, body])[None], None, position[None], mask[None, None])[0]
        out.append(logits[n - 1 :])
    return torch.stack(out)


@pytest.mark.parametrize("window", [1, 2])
def test_every_forward_equals_the_no_cache_forward_of_its_definition(janus, window, monkeypatch):
    """Forwards with proxies after a complete row (window 1: row 2's) and an incomplete one (row 3's), dropped
    proxies, fills of completed rows: every entry's logits, 1e-5 (fp32)."""
    check_forwards(janus, (4, 4), window, monkeypatch)


@pytest.mark.parametrize(("build", "prompt"), [(lambda: rejecting_anole(), PROMPT), (lambda: rejecting_llamagen("c2i"), "7")],
                         ids=["anole", "llamagen"])
def test_other_raster_models_decode_by_the_definition(build, prompt, monkeypatch):
    """Anole (CFG rows of different prompt lengths) and LlamaGen (2-D rotary from the position ids): the same check."""
    adapter = build()
    check_forwards(adapter, adapter.layout.grid, 1, monkeypatch, prompt)


def check_forwards(janus, grid: tuple[int, int], window: int, monkeypatch, prompt: str = PROMPT) -> None:
    """Every entry's logits of one ZipAR image equal :func:`reference_entry_logits` (5e-5: fp32 sums in another order
    differ by up to 1.5e-5 on logits of size 4, seen on an AMD EPYC), and a proxy one cell earlier
    does not."""
    recorded = []
    forward = SlotBatch.forward

    def recording(self, *args, **kwargs):
        logits = forward(self, *args, **kwargs)
        recorded.append(logits[0])
        return logits

    monkeypatch.setattr(SlotBatch, "forward", recording)
    gen = JacobiEngine(janus, SJD(), ZipARDrafter(window_size=window)).generate(prompt, 3)
    forwards = zipar_schedule(*grid, window)
    code_of = {int(t): c for c, t in enumerate(janus.image_token_ids)}  # a record holds token ids
    codes = {cell: code_of[t] for cell, t in enumerate(gen.tokens.tolist())}
    assert len(recorded) == len(forwards) == gen.nfe
    assert any(f.proxies for f in forwards)
    expected = reference_entry_logits(janus, prompt, forwards, codes)
    assert torch.allclose(torch.cat(recorded, dim=1), expected, atol=5e-5, rtol=0)
    # negative control: the first proxy one cell earlier (a wrong position id) changes the reference
    t = next(t for t, f in enumerate(forwards) if f.proxies)
    (src, pos) = forwards[t].entries[-1]
    wrong = forwards[:t] + [Forward(forwards[t].entries[:-1] + ((src, pos - 1),), *astuple(forwards[t])[1:])]
    shifted = reference_entry_logits(janus, prompt, wrong, codes)
    assert not torch.allclose(torch.cat(recorded, dim=1)[:, : shifted.shape[1]], shifted, atol=5e-5, rtol=0)


@torch.no_grad()
def zipar_law(adapter, prompt: str, forwards) -> dict[tuple[int, ...], float]:
    """P(image) = prod over committed cells of q(token | its query entry), every image enumerated."""
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    queries = [sum(len(g.entries) for g in forwards[:t]) + j for t, f in enumerate(forwards) for j in f.queries]
    cells = [c for f in forwards for c in f.commits]
    law = {}
    for image in itertools.product(range(adapter.vocab_size), repeat=len(cells)):
        q = pipeline(reference_entry_logits(adapter, prompt, forwards, dict(enumerate(image)))[:, queries])
        law[image] = float(torch.prod(q[torch.arange(len(cells)), torch.tensor([image[c] for c in cells])]))
    return law


#: samples of the law test (about 5 tiny forwards each)
N_LAW = 300


@pytest.mark.slow
@pytest.mark.statistical
def test_the_sequence_law_is_the_enumerated_one():
    """3 x 2 images of 2 codes (64 images; a tiny Janus read as a 3 x 2 grid), window_size 1; negative control: the
    same samples against AR's law (total variation 0.18 from ZipAR's; simulated p-values at this sample size are
    below 1e-7). A proxy at a wrong position moves this tiny model's law by only 0.014: the position ids are pinned
    by the forward test above instead."""
    adapter = rejecting_janus(grid=3, codebook=2)
    adapter.layout = BodyLayout.raster(3, 2)
    engine = JacobiEngine(adapter, SJD(), ZipARDrafter(window_size=1))
    counts = Counter(tuple(engine.generate(PROMPT, seed).tokens.tolist()) for seed in range(N_LAW))
    assert chi_square_pvalue(counts, zipar_law(adapter, PROMPT, zipar_schedule(3, 2, 1))) > 1e-3
    assert chi_square_pvalue(counts, exact_sequence_distribution(adapter, PROMPT)) < 1e-6


@pytest.mark.parametrize(("overrides", "message"), [
    (["method=csd"], "only the lossless rule applies: use method=sjd, got method=csd"),
    (["method=ar"], "use method=sjd, got method=ar"),
    (["drafter.window_size=0"], "drafter.window_size=0 must be an integer >= 1"),
    (["engine.compile=true"], "drafter=zipar runs eagerly (shifted position ids): set engine.compile=false"),
    (["model=lumina_mgpt_tiny"], "LuminaAdapter forces an end-of-line token per row"),
    (["model=emu3_tiny"], "Emu3Adapter forces an end-of-line token per row"),
])
def test_bad_settings_fail_in_one_line_before_the_model_loads(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        validate(make_cfg("model=janus_pro_7b", "method=sjd", "drafter=zipar", *overrides))
    assert "\n" not in str(err.value)
    validate(make_cfg("model=janus_pro_7b", "method=sjd", "drafter=zipar"))
