"""The one KV cache (``csd.ragged``): every slot's logits equal the no-cache forward of its prompt and kept entries
(``reference_logits``), slots are independent, the compiled path's fixed cache equals the eager one, and the bounds
are checked. fp32, CPU: the shipped toy model and a tiny random Janus (``tests.helpers.rejecting_janus``, whose image
tokens feed back into the logits), with and without CFG."""

from __future__ import annotations

import pytest
import torch

from csd.adapters.base import ModelAdapter
from csd.adapters.toy import load_toy_adapter
from csd.fast import CompiledStep
from csd.ragged import SlotBatch
from tests.helpers import check_windows_against_reference, rejecting_janus

torch.set_num_threads(1)

#: max |cached - reference| seen: Janus 7e-7 (logits up to 3), toy 2e-5 (logits of magnitude ~12; the reference attends
#: over exactly its own keys with a causal mask, the cache over a power-of-two bound with its mask, and CPU GEMMs
#: round differently for different row counts)
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


@pytest.mark.parametrize("cfg", [True, False], ids=["cfg", "no_cfg"])
@pytest.mark.parametrize("model", ["toy", "janus"])
def test_batched_windows_match_the_reference(model, cfg):
    adapter = make_adapter(model, cfg)
    prompts = PROMPTS[model]
    grew = check_windows_against_reference(adapter, prompts[:3], prompts[3], **TOLERANCE)
    assert grew == (model == "janus")  # the long refill grows the cache


@pytest.mark.parametrize("model", ["toy", "janus"])
def test_slot_logits_do_not_depend_on_other_slots(model):
    adapter = make_adapter(model, cfg=True)
    prompts = PROMPTS[model]
    gen = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, adapter.vocab_size, (2, 4), generator=gen) for _ in range(3)]
    outputs = []
    for other_prompt, other_seed in ((prompts[1], 0), (prompts[2], 1)):
        other = torch.Generator().manual_seed(other_seed)
        batch = SlotBatch(adapter, 2)
        batch.prefill(0, prompts[0])
        batch.prefill(1, other_prompt)
        slot0 = []
        for step, ids in enumerate(windows):
            ids = ids.clone()
            ids[1] = torch.randint(0, adapter.vocab_size, (4,), generator=other)
            slot0.append(batch.forward(ids, [step == 0] * 2, [True, True])[0])
            batch.rollback([1, int(torch.randint(0, 5, (), generator=other))])
        outputs.append(slot0)
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)


def test_bounds_are_checked():
    adapter = make_adapter("janus", cfg=True)
    batch = SlotBatch(adapter, 2)
    for slot in range(2):
        batch.prefill(slot, "a cat")
    cache = batch.cache
    free = cache.capacity - cache.filled[0]
    with pytest.raises(ValueError, match="cache overflow"):
        batch.forward(torch.zeros(2, free + 1, dtype=torch.long), [True, True], [True, True])
    batch.forward(torch.zeros(2, free, dtype=torch.long), [True, True], [True, True])
    with pytest.raises(ValueError, match="cannot roll back"):
        batch.rollback([0, cache.filled[2] + 1])
    batch.rollback([0, free])
    with pytest.raises(ValueError, match="slot=2"):
        batch.prefill(2, "a dog")
    # a full but inactive slot does not stop the others, and its rollback count is ignored
    batch.forward(torch.zeros(2, 3, dtype=torch.long), [False, False], [False, True])
    batch.rollback([3, 3])
    assert cache.filled[:2] == [cache.capacity] * 2
    with pytest.raises(ValueError, match="slots=0"):
        SlotBatch(adapter, 0)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["toy", "janus"])
def test_compiled_batched_windows_match_eager_batched(model):
    """The compiled path's fixed cache (traced with the ``eager`` backend) gives the eager cache's logits, slot by
    slot (measured: equal on the first window, within 5e-7 after: the fixed cache attends over its whole capacity)."""
    adapter = make_adapter(model, cfg=True)
    gen = torch.Generator().manual_seed(2)
    batches = [SlotBatch(adapter, 3), SlotBatch(adapter, 3, CompiledStep(adapter, backend="eager"))]
    for batch in batches:
        for slot, prompt in enumerate(PROMPTS[model][:3]):
            batch.prefill(slot, prompt)
    assert batches[1].cache.fixed and not batches[0].cache.fixed
    for step, k in enumerate((4, 1, 4)):
        ids = torch.randint(0, adapter.vocab_size, (3, k), generator=gen)
        active = [True, step != 1, True]
        out = [batch.forward(ids, [step == 0] * 3, active) for batch in batches]
        ran = [slot for slot in range(3) if active[slot]]
        torch.testing.assert_close(out[1][ran], out[0][ran], rtol=0, atol=2e-6)
        n = [int(torch.randint(0, k + 1, (), generator=gen)) for _ in range(3)]
        for batch in batches:
            batch.rollback(n)
    assert batches[1].cache.filled == batches[0].cache.filled
