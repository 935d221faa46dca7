"""bf16 models on CPU (``model.dtype=bfloat16``): every adapter decodes end to end; the target, its entropy and the
acceptance are computed in fp32 from the bf16 logits (the shared processor pipeline casts them first,
``csd.processors.TargetPipeline``); greedy bf16 tokens of the toy model mostly equal its fp32 tokens."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from csd.acceptance import CSD, SJD
from csd.compose import build_adapter
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.presets import CONF_DIR
from csd.toy.domain import toy_prompts

torch.set_num_threads(1)


def adapter_in(name: str, dtype: str, **overrides):
    model = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
    model.dtype = dtype
    for key, value in overrides.items():
        model[key] = value
    return build_adapter(model, torch.device("cpu"))


@pytest.mark.parametrize("name", ["janus_pro_tiny", "lumina_mgpt_tiny", "emu3_tiny", "anole_tiny", "llamagen_c2i_tiny",
                                  "llamagen_t2i_tiny"])  # the toy: the greedy test
def test_every_adapter_decodes_end_to_end_in_bf16(name):
    adapter = adapter_in(name, "bfloat16")
    assert adapter.decoder().dtype == torch.bfloat16
    prompt = "207" if name == "llamagen_c2i_tiny" else toy_prompts(1)[0].text  # a class id for the class-conditional
    gen = JacobiEngine(adapter, CSD(lam=0.1, delta=0.5), ChainDrafter(window=8)).generate(prompt, 0)
    assert gen.tokens.numel() == adapter.layout.length and 1 <= gen.nfe <= adapter.layout.length
    assert torch.isfinite(gen.entropy).all()
    images = adapter.decode_images(gen.tokens.unsqueeze(0))
    assert images.dtype == torch.uint8 and images.shape[0] == 1


class RecordingCSD(CSD):
    """CSD that records the dtypes of everything its acceptance and residual are given."""

    def __init__(self) -> None:
        super().__init__(lam=0.1, delta=0.5)
        self.seen: set[torch.dtype] = set()

    def accept_prob(self, target_probs, draft_probs, drafts, target_entropy):
        self.seen |= {target_probs.dtype, draft_probs.dtype, target_entropy.dtype}
        return super().accept_prob(target_probs, draft_probs, drafts, target_entropy)

    def residual(self, target_probs, draft_probs, drafts):
        self.seen |= {target_probs.dtype, draft_probs.dtype}
        return super().residual(target_probs, draft_probs, drafts)


def test_the_verifier_never_sees_bf16_probabilities():
    adapter = adapter_in("janus_pro_tiny", "bfloat16")
    raw: set[torch.dtype] = set()
    step = adapter.decode_step

    def recording_step(*args, **kwargs):
        logits = step(*args, **kwargs)
        raw.add(logits.dtype)
        return logits

    adapter.decode_step = recording_step
    rule = RecordingCSD()
    gen = JacobiEngine(adapter, rule, ChainDrafter(window=8)).generate("a red cat", 0)
    assert raw == {torch.bfloat16}  # the model's logits are bf16 ...
    assert rule.seen == {torch.float32}  # ... its targets, entropies and draft laws fp32
    assert gen.entropy.dtype == torch.float32 and gen.stats["drafts_verified"] > 0


@pytest.mark.slow
def test_greedy_bf16_tokens_mostly_equal_fp32_on_the_toy():
    """Top-1 AR (one-hot targets) on 4 held-out prompts: measured 98.5 % of positions equal (2 prompts identical; a
    prompt's tokens drift after the first argmax that bf16 rounding flips). On 8 prompts: 95.3 %, 4 identical."""
    prompts = [p.text for p in toy_prompts(4)]
    tokens = {}
    for dtype in ("float32", "bfloat16"):
        engine = JacobiEngine(adapter_in("toy", dtype, top_k=1), SJD(), ChainDrafter(window=1))
        tokens[dtype] = torch.stack([engine.generate(p, 0).tokens for p in prompts])
    assert engine.adapter.decoder().dtype == torch.bfloat16
    assert engine.adapter.decode_images(tokens["bfloat16"]).shape == (len(prompts), 32, 32, 3)
    share = (tokens["float32"] == tokens["bfloat16"]).float().mean().item()
    assert share >= 0.9  # all equal on some CPUs (this AMD EPYC): whether a near-tie flips depends on the kernels
