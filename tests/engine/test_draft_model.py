"""drafter=draft_model: speculative sampling with a separate draft model (docs/ALGORITHMS.md "Draft model").

The target is the tiny Janus of the lossless test (2x2 tokens over 3 codes, targets that move with the previous
token); the draft model is another seeded random tiny Janus of the same vocabulary, so its drafts are often rejected.
SJD on its drafts must give exactly AR's sequence law (chi-square against the enumerated law), and the same test must
catch a drafter that records another law than it samples from. On a tiny Lumina-mGPT (end-of-line tokens, an AR
tail) the recorded laws equal the draft model's processed laws computed without a cache, batch 4 gives batch 1's
tokens, and the records count one draft forward per free draft.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from csd.acceptance import SJD
from csd.drafters.draft_model import DraftModelDrafter
from csd.engine import JacobiEngine
from csd.processors import TargetPipeline
from csd.ragged import reference_logits
from csd.slot import Request
from tests.helpers import (
    chi_square_pvalue,
    exact_sequence_distribution,
    host_reads_per_batched_run,
    rejecting_janus,
    rejecting_lumina,
)

PROMPT = "a cat"
PROMPTS = ("a cat", "two dogs on a long red sofa")


def tiny_janus(seed: int, codebook: int = 3):
    return rejecting_janus(grid=2, codebook=codebook, head_scale=12.0, guidance_scale=2.0, seed=seed)


@pytest.fixture(scope="module")
def janus():
    """The target (seed 1), its exact sequence law, and a draft model (seed 2)."""
    target = tiny_janus(1)
    return target, exact_sequence_distribution(target, PROMPT), tiny_janus(2)


class WrongRecord(DraftModelDrafter):
    """Draws each draft from the draft model's law but records the uniform law: a biased drafter."""

    def _draft_step(self, slots, plans, active, step):
        super()._draft_step(slots, plans, active, step)
        for plan, on in zip(plans, active, strict=True):
            if on:
                plan.probs[plan.free[step] - plan.n] = 1.0 / self.vocab


def sequence_counts(target, drafter, n: int, offset: int) -> tuple[Counter, dict[str, int]]:
    """The decoded sequences of ``n`` seeds (batch 16: an image's tokens do not depend on the batch) and the summed
    counters."""
    engine = JacobiEngine(target, SJD(), drafter, batch_size=16)
    gens = [gen for _, gen in engine.generate_many(Request(PROMPT, offset + s) for s in range(n))]
    totals = {key: sum(g.stats[key] for g in gens) for key in gens[0].stats}
    return Counter(tuple(g.tokens.tolist()) for g in gens), totals


@pytest.mark.statistical
@pytest.mark.slow
def test_sjd_on_draft_model_drafts_is_lossless(janus):
    target, probs, draft = janus
    counts, totals = sequence_counts(target, DraftModelDrafter(draft=draft, model="janus_pro_tiny", gamma=3), 1200, 0)
    assert chi_square_pvalue(counts, probs) > 1e-3
    # the test has power only if drafts are both accepted and rejected (measured: 40 % of verified drafts rejected)
    rejected = totals["drafts_verified"] - totals["drafts_accepted"]
    assert rejected > 0.25 * totals["drafts_verified"] and totals["drafts_accepted"] > 0.4 * totals["drafts_verified"]


@pytest.mark.statistical
@pytest.mark.slow
def test_a_wrong_recorded_draft_law_is_detected(janus):
    target, probs, draft = janus
    counts, _ = sequence_counts(target, WrongRecord(draft=draft, model="janus_pro_tiny", gamma=3), 400, 50_000)
    assert chi_square_pvalue(counts, probs) < 1e-6  # measured: 1e-64 over 1500 images


def test_a_draft_model_equal_to_the_target_has_every_draft_accepted(janus):
    """The recorded p of an identical draft model is the target's q, so SJD accepts every draft (b = 1)."""
    target, _, _ = janus
    engine = JacobiEngine(target, SJD(), DraftModelDrafter(draft=tiny_janus(1), model="janus_pro_tiny", gamma=2))
    for seed in range(5):
        gen = engine.generate(PROMPT, seed=seed)
        assert gen.stats["drafts_accepted"] == gen.stats["drafts_verified"] == gen.stats["drafter_forwards"] == 2
        assert gen.nfe == 2


def test_the_drafter_time_is_part_of_the_decode_time(janus):
    """drafter_s: the propose steps' time, timed at batch 1 (the draft forwards dominate it), None when batched."""
    target, _, draft = janus
    gen = JacobiEngine(target, SJD(), DraftModelDrafter(draft=draft, model="janus_pro_tiny", gamma=3)).generate(PROMPT, 0)
    assert 0 < gen.drafter_s < gen.decode_s
    engine = JacobiEngine(target, SJD(), DraftModelDrafter(draft=draft, model="janus_pro_tiny"), batch_size=2)
    assert all(g.drafter_s is None for _, g in engine.generate_many([Request(PROMPT, 0), Request(PROMPT, 1)]))


@pytest.fixture(scope="module")
def lumina():
    """A tiny Lumina-mGPT target (3x3 codes, an end-of-line token after each row, an AR tail of 2) and a draft model
    of the same vocabulary and layout: the same random weights with a flatter head (another seed would map the codes
    to other token ids)."""
    return rejecting_lumina(), rejecting_lumina(head_scale=4.0)


def recorded_windows(drafter: DraftModelDrafter) -> list[tuple]:
    """Every window the drafter builds: (prompt, committed prefix, plan), captured without changing a token."""
    seen, build = [], drafter._window

    def window(slot, plan, forwards):
        seen.append((slot.request.prompt, slot.body[: plan.n].clone(), plan))
        return build(slot, plan, forwards)

    drafter._window = window
    return seen


def expected_forwards(gen, adapter, gamma: int) -> int:
    """One draft forward per free position among each window's drafts (none at forced positions, none in the tail)."""
    layout, free = adapter.layout, (adapter.layout.forced_ids < 0).tolist()
    total = 0
    for it in range(gen.nfe):
        n = int((gen.commit_iter == it).nonzero()[0])
        rows = 1 if layout.length - n <= layout.jacobi_tail else min(gamma + 1, layout.length - n)
        total += sum(free[n : n + rows - 1])
    return total


def test_batched_draft_model_decoding_matches_batch_1_and_counts_its_forwards(lumina, monkeypatch):
    target, draft = lumina
    requests = [Request(PROMPTS[s % 2], s) for s in range(6)]
    engines = {b: JacobiEngine(target, SJD(), DraftModelDrafter(draft=draft, model="lumina_mgpt_tiny", gamma=3),
                               batch_size=b) for b in (1, 4)}
    windows = recorded_windows(engines[4].drafter)
    runs = {b: {r.seed: g for r, g in e.generate_many(requests)} for b, e in engines.items()}
    for seed, one in runs[1].items():
        four = runs[4][seed]
        assert torch.equal(one.tokens, four.tokens) and one.nfe == four.nfe and one.stats == four.stats
        assert torch.equal(one.commit_iter, four.commit_iter)
        assert one.stats["drafter_forwards"] == one.stats["drafts_proposed"] == expected_forwards(one, target, 3)
    stats = [g.stats for g in runs[1].values()]
    assert sum(s["drafts_verified"] - s["drafts_accepted"] for s in stats) >= 10  # rejections roll the draft cache back
    assert sum(s["drafts_accepted"] for s in stats) >= 10
    # the recorded laws are the draft model's processed laws of the committed prefix and the earlier drafts
    pipeline = TargetPipeline.build(draft.sampling, draft.raw_image_columns)
    body = engines[4].body
    for prompt, prefix, plan in windows:
        ids = body(torch.cat([prefix, plan.drafts]), 0)
        law = pipeline(reference_logits(draft, prompt, ids))
        for j in plan.free:
            torch.testing.assert_close(plan.probs[j - plan.n], law[j], atol=1e-4, rtol=0)
    assert len(windows) > 20
    reads, expected = host_reads_per_batched_run(engines[4], requests, monkeypatch)
    assert reads == expected  # one host read per iteration (the committed counts) plus one per finished image


def test_a_draft_model_of_another_vocabulary_is_refused(janus, lumina):
    target, _, _ = janus
    with pytest.raises(ValueError, match=r"image vocabulary \(4 codes\) is not the target's \(3 codes\)") as err:
        JacobiEngine(target, SJD(), DraftModelDrafter(draft=tiny_janus(2, codebook=4), model="janus_pro_tiny"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="other token ids than the target's"):  # another random tokenizer map
        JacobiEngine(lumina[0], SJD(), DraftModelDrafter(draft=rejecting_lumina(seed=1), model="lumina_mgpt_tiny"))
