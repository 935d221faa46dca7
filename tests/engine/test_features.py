"""The target's hidden states returned with a forward (``SlotBatch.forward(features=True)``, the adapters'
``features_step`` / ``head`` / ``embed``): equal to a no-cache full forward's, and the output head turns them into
the forward's logits (docs/ALGORITHMS.md, "EAGLE: a trained draft head")."""

from __future__ import annotations

import pytest
import torch

from csd.adapters.toy import load_toy_adapter
from csd.ragged import reference_features, reference_logits
from tests.helpers import (
    prefilled_batch,
    rejecting_emu3,
    rejecting_janus,
    rejecting_llamagen,
    rejecting_lumina,
)

PROMPTS = ("two red circles", "a blue square")


@pytest.mark.parametrize("make", [rejecting_janus, rejecting_lumina, rejecting_emu3, rejecting_llamagen, load_toy_adapter],
                         ids=["janus", "lumina", "emu3", "llamagen", "toy"])
def test_features_equal_a_full_forward_and_give_the_logits(make):
    adapter = make()
    assert adapter.exposes_features()
    batch = prefilled_batch(adapter, PROMPTS)
    gen = torch.Generator().manual_seed(0)
    kept = [torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)]
    for step, k in enumerate((3, 4, 2)):
        ids = adapter.image_token_ids[torch.randint(0, adapter.vocab_size, (2, k), generator=gen)]
        first = step == 0
        logits, features = batch.forward(ids, [first, first], [True, True], features=True)
        torch.testing.assert_close(adapter.head(features), logits)
        for slot, prompt in enumerate(PROMPTS):
            window = ids[slot, 1:] if first else ids[slot]
            body = torch.cat([kept[slot], window])
            torch.testing.assert_close(features[slot], reference_features(adapter, prompt, body)[:, -k:],
                                       atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(logits[slot], reference_logits(adapter, prompt, body)[:, -k:],
                                       atol=1e-4, rtol=1e-4)
            kept[slot] = body[:-1]  # the rollback of 1 drops the window's last entry
        batch.rollback([1, 1])
    ids = adapter.image_token_ids[:3].view(1, 3)
    embeds = adapter.embed(ids)
    assert embeds.shape == (1, 3, adapter.decoder().config.hidden_size)


def test_a_forward_without_features_is_unchanged():
    adapter = rejecting_janus()
    ids = adapter.image_token_ids[torch.tensor([[1, 2, 3], [4, 5, 6]])]
    plain = prefilled_batch(adapter, PROMPTS).forward(ids, [True, True], [True, True])
    logits, _ = prefilled_batch(adapter, PROMPTS).forward(ids, [True, True], [True, True], features=True)
    assert torch.equal(plain, logits)
