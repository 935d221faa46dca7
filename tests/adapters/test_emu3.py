"""Emu3 adapter on a seeded tiny random ``Emu3ForConditionalGeneration`` (fp32, CPU).

References use the HF model directly: no cache, conditional and negative-prompt branches as separate
unpadded passes, CFG on log-softmax values by hand. The engine run counts (``tests.helpers.decode_counts``) and
requires rollbacks across the forced tokens (``tests.helpers.rejecting_emu3``: targets of 1.4 nats over 8 codes).
"""

from __future__ import annotations

import pytest
import torch

from baselines.relaxed import Amplify
from csd.acceptance import CSD, SJD
from csd.adapters.emu3 import Emu3Adapter, tiny_emu3_adapter
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from tests.helpers import OneImage, forced_token_run, random_body, rejecting_emu3

PROMPT = "a red cube"




def hf_logits(adapter: Emu3Adapter, ids: torch.Tensor) -> torch.Tensor:
    return adapter.model(input_ids=ids.unsqueeze(0)).logits[0]


def reference_greedy(adapter: Emu3Adapter) -> torch.Tensor:
    cond_prompt, neg_prompt = adapter.prompt_rows(PROMPT)
    forced = adapter.layout.forced_ids
    scale = adapter.sampling.guidance_scale
    body: list[int] = []
    with torch.no_grad():
        for n in range(adapter.layout.length):
            if forced[n] >= 0:
                body.append(int(forced[n]))
                continue
            done = torch.tensor(body, dtype=torch.long)
            cond = torch.log_softmax(hf_logits(adapter, torch.cat([cond_prompt, done]))[-1], -1)
            uncond = torch.log_softmax(hf_logits(adapter, torch.cat([neg_prompt, done]))[-1], -1)
            guided = (uncond + scale * (cond - uncond))[adapter.image_token_ids]
            body.append(int(adapter.image_token_ids[guided.argmax()]))
    return torch.tensor(body)



def test_layout_and_prompt():
    a = tiny_emu3_adapter(grid=(2, 3))
    vocab = a.model.config.vocabulary_map
    eol, eof, eoi = vocab["<|extra_200|>"], vocab["<|extra_201|>"], vocab["<|image end|>"]
    assert a.layout.forced_ids.tolist() == ([-1] * 3 + [eol]) * 2 + [eof, eoi]
    assert sorted(a.image_token_ids.tolist()) != a.image_token_ids.tolist()  # a lookup, not an offset
    cond, neg = a.prompt_rows(PROMPT)
    assert cond[-1] == vocab["<|image token|>"] and neg[-1] == vocab["<|image token|>"]


def test_greedy_engine_equals_reference_loop():
    a = tiny_emu3_adapter(grid=(2, 3), head_scale=3.0, top_k=1)
    out = JacobiEngine(a, SJD(), ChainDrafter(window=1)).generate(PROMPT, seed=0)
    assert torch.equal(out.tokens, reference_greedy(a))


def test_window_logits_equal_step_by_step_and_rollback_is_exact():
    a = tiny_emu3_adapter(grid=(2, 3))
    body, other = random_body(a, 0), random_body(a, 1)
    with torch.no_grad():
        window = OneImage(a, PROMPT).forward(body[:6], with_prompt_tail=True)
        ctx = OneImage(a, PROMPT)
        steps = [ctx.forward(body[:1], with_prompt_tail=True)] + [ctx.forward(body[j : j + 1]) for j in range(1, 6)]
        torch.testing.assert_close(window, torch.cat(steps, dim=1), rtol=1e-5, atol=1e-5)
        ctx.rollback(3)
        resumed = ctx.forward(other[3:6])
        fresh = OneImage(a, PROMPT).forward(torch.cat([body[:3], other[3:6]]), with_prompt_tail=True)
    torch.testing.assert_close(resumed, fresh[:, -3:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("negative", ["x", "a much longer negative prompt than the caption"])
def test_batched_cfg_equals_separate_passes(negative):
    """Whichever branch is shorter is left-padded; both must match their unpadded passes."""
    a = tiny_emu3_adapter(grid=(2, 3), negative_prompt=negative)
    body = random_body(a, 2)[:5]
    cond_prompt, neg_prompt = a.prompt_rows(PROMPT)
    with torch.no_grad():
        rows = OneImage(a, PROMPT).forward(body, with_prompt_tail=True)
        cond = hf_logits(a, torch.cat([cond_prompt, body]))[cond_prompt.numel() - 1 :]
        uncond = hf_logits(a, torch.cat([neg_prompt, body]))[neg_prompt.numel() - 1 :]
    torch.testing.assert_close(rows[0], cond, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows[1], uncond, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", [SJD(), CSD(lam=1.0, delta=1.0), Amplify(factor=10)], ids=["sjd", "csd", "amplify"])
def test_forced_tokens_land_in_place_and_image_decodes(rule):
    a = rejecting_emu3(grid=(3, 4), jacobi_tail=2)
    out, exercised = forced_token_run(a, rule, PROMPT)
    # rolled back across forced tokens; measured rejections: SJD 18 (11 of a carried draft), Amplify 7, CSD(1, 1) accepts every draft
    assert exercised.rollbacks >= {"sjd": 6, "amplify": 3}.get(rule.name, 0), exercised
    image = a.decode_images(out.tokens.unsqueeze(0))
    factor = a.model.model.vqmodel.vision_spatial_factor
    assert image.shape == (1, 3 * factor, 4 * factor, 3) and image.dtype == torch.uint8
