"""The batched KV cache (``csd.ragged``): every slot's logits equal its single-context ones, slots are
independent, and the bounds are checked. fp32, CPU: the shipped toy model and a tiny random Janus
(``tests.helpers.rejecting_janus``, whose image tokens feed back into the logits), with and without CFG."""

from __future__ import annotations

import pytest
import torch

from csd.adapters.base import DecodeContext, ModelAdapter
from csd.adapters.toy import load_toy_adapter
from tests.helpers import prefilled_batch, rejecting_janus

torch.set_num_threads(1)

#: max |batched - single| seen: Janus 7e-7 (logits up to 3), toy 2e-5 (logits of magnitude ~12; the single path attends
#: over exactly its own keys without a mask, the batched one over the whole capacity with a mask, and
#: CPU GEMMs round differently for different row counts)
TOLERANCE = dict(rtol=1e-5, atol=1e-4)
PROMPTS = {  # per model: three prompts of different lengths (all toy prompts have the same length) + a refill
    "janus": ("a red cat", "a dog on grass near a tree", "x", "a long caption " * 14),  # the refill grows the cache
    "toy": ("a red circle", "two blue squares on a checkered background", "", "a green triangle"),
}


def make_adapter(model: str, cfg: bool) -> ModelAdapter:
    guidance = 3.0 if cfg else 1.0
    if model == "toy":
        return load_toy_adapter(guidance_scale=guidance)
    return rejecting_janus(guidance_scale=guidance)  # 4x4 tokens, 16 codes


def single_forward(adapter: ModelAdapter, ctx: DecodeContext, ids: torch.Tensor, from_prompt: bool) -> torch.Tensor:
    """The single-context path: the anchor ids[0] is replaced by the prompt tail on a slot's first window."""
    return adapter.forward(ctx, ids[1:], with_prompt_tail=True) if from_prompt else adapter.forward(ctx, ids)


@pytest.mark.parametrize("cfg", [True, False], ids=["cfg", "no_cfg"])
@pytest.mark.parametrize("model", ["toy", "janus"])
def test_batched_windows_match_single_contexts(model, cfg):
    adapter = make_adapter(model, cfg)
    prompts = PROMPTS[model]
    gen = torch.Generator().manual_seed(0)
    state, contexts = prefilled_batch(adapter, prompts[:3])
    from_prompt = [True] * 3
    # window sizes as the engine makes them (shrinking at the end of an image); slot 2 refilled before
    # step 3; slot 1 inactive at step 4 (its output ignored, rolled back by K)
    for step, k in enumerate((4, 4, 3, 4, 1, 4)):
        if step == 3:
            capacity = state.cache.capacity
            adapter.prefill_slot(state, 2, prompts[3])
            assert (state.cache.capacity > capacity) == (model == "janus")
            contexts[2] = adapter.prefill(prompts[3])
            from_prompt[2] = True
        active = [True, step != 4, True]
        ids = torch.randint(0, adapter.vocab_size, (3, k), generator=gen)
        logits = adapter.forward_batch(state, ids, from_prompt, active)
        assert logits.shape == (3, 2 if cfg else 1, k, adapter.vocab_size)
        for slot in range(3):
            if active[slot]:
                ref = single_forward(adapter, contexts[slot], ids[slot], from_prompt[slot])
                torch.testing.assert_close(logits[slot], ref, **TOLERANCE)
        n = [int(torch.randint(0, k + 1, (), generator=gen)) for _ in range(3)]
        n[1] = n[1] if active[1] else k
        adapter.rollback_batch(state, n)
        for slot in range(3):
            if active[slot]:
                adapter.rollback(contexts[slot], n[slot])
            from_prompt[slot] = False


@pytest.mark.parametrize("model", ["toy", "janus"])
def test_slot_logits_do_not_depend_on_other_slots(model):
    adapter = make_adapter(model, cfg=True)
    prompts = PROMPTS[model]
    gen = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, adapter.vocab_size, (2, 4), generator=gen) for _ in range(3)]
    outputs = []
    for other_prompt, other_seed in ((prompts[1], 0), (prompts[2], 1)):
        other = torch.Generator().manual_seed(other_seed)
        state = adapter.start_batch(2)
        adapter.prefill_slot(state, 0, prompts[0])
        adapter.prefill_slot(state, 1, other_prompt)
        slot0 = []
        for step, ids in enumerate(windows):
            ids = ids.clone()
            ids[1] = torch.randint(0, adapter.vocab_size, (4,), generator=other)
            slot0.append(adapter.forward_batch(state, ids, [step == 0] * 2, [True, True])[0])
            adapter.rollback_batch(state, [1, int(torch.randint(0, 5, (), generator=other))])
        outputs.append(slot0)
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)


def test_bounds_are_checked():
    adapter = make_adapter("janus", cfg=True)
    state = adapter.start_batch(2)
    for slot in range(2):
        adapter.prefill_slot(state, slot, "a cat")
    cache = state.cache
    free = cache.capacity - cache.filled[0]
    with pytest.raises(ValueError, match="cache overflow"):
        adapter.forward_batch(state, torch.zeros(2, free + 1, dtype=torch.long), [True, True], [True, True])
    adapter.forward_batch(state, torch.zeros(2, free, dtype=torch.long), [True, True], [True, True])
    with pytest.raises(ValueError, match="cannot roll back"):
        adapter.rollback_batch(state, [0, cache.filled[2] + 1])
    adapter.rollback_batch(state, [0, free])
    with pytest.raises(ValueError, match="slot=2"):
        adapter.prefill_slot(state, 2, "a dog")
    # a full but inactive slot does not stop the others, and its rollback count is ignored
    adapter.forward_batch(state, torch.zeros(2, 3, dtype=torch.long), [False, False], [False, True])
    adapter.rollback_batch(state, [3, 3])
    assert cache.filled[:2] == [cache.capacity] * 2
    with pytest.raises(ValueError, match="slots=0"):
        adapter.start_batch(0)


@pytest.mark.parametrize("model", ["toy", "janus"])
def test_static_batched_windows_match_eager_batched(model):
    """The static (compiled-path) adapter's fixed cache gives the eager batched cache's logits, slot by slot."""
    eager = make_adapter(model, cfg=True)
    static = load_toy_adapter(guidance_scale=3.0, cache="static") if model == "toy" else rejecting_janus(
        guidance_scale=3.0, cache="static"
    )
    gen = torch.Generator().manual_seed(2)
    states = [adapter.start_batch(3) for adapter in (eager, static)]
    for adapter, state in zip((eager, static), states, strict=True):
        for slot, prompt in enumerate(PROMPTS[model][:3]):
            adapter.prefill_slot(state, slot, prompt)
    assert states[1].cache.fixed and not states[0].cache.fixed
    for step, k in enumerate((4, 1, 4)):
        ids = torch.randint(0, eager.vocab_size, (3, k), generator=gen)
        active = [True, step != 1, True]
        out = [a.forward_batch(s, ids, [step == 0] * 3, active) for a, s in zip((eager, static), states, strict=True)]
        ran = [slot for slot in range(3) if active[slot]]
        assert torch.equal(out[1][ran], out[0][ran])
        n = [int(torch.randint(0, k + 1, (), generator=gen)) for _ in range(3)]
        for adapter, state in zip((eager, static), states, strict=True):
            adapter.rollback_batch(state, n)
    assert states[1].cache.filled == states[0].cache.filled
