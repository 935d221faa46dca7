"""ARsample's dynamic temperature as a target processor (docs/ALGORITHMS.md "The target q").

``model.entropy_temperature`` divides each row's logits by ``T = clamp(t0 exp(-H/alpha) + theta, lo, hi)``,
``H`` the entropy of that row's softmax after CFG and before top-k (the released Lumina-mGPT code). It is
part of the target ``q``, so SJD stays exact with respect to the tempered target.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from csd.acceptance import SJD
from csd.adapters.base import EntropyTemperature, SamplingConfig
from csd.adapters.janus import tiny_janus_adapter
from csd.compose import build_adapter
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.processors import TargetPipeline
from csd.validate import validate
from tests.helpers import chi_square_pvalue, exact_sequence_distribution
from tests.pipeline.test_config import make_cfg

RELEASED = "{t0:1.5,alpha:2.5,theta:0.7,lo:0.7,hi:2.0}"


def softmax(row: list[float]) -> list[float]:
    z = sum(math.exp(v) for v in row)
    return [math.exp(v) / z for v in row]


def hand_temperature(row: list[float], t0: float, alpha: float, theta: float, lo: float, hi: float) -> float:
    h = -sum(p * math.log(p) for p in softmax(row) if p > 0)
    return min(hi, max(lo, t0 * math.exp(-h / alpha) + theta))


def test_processor_matches_a_hand_computation():
    rows = [[2.0, 1.0, 0.5, -1.0, 0.0], [9.0, 0.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.1, 0.0, 0.1]]
    params = EntropyTemperature()
    q = TargetPipeline.build(SamplingConfig(entropy_temperature=params))(torch.tensor([rows]))
    for got, row in zip(q, rows, strict=True):
        t = hand_temperature(row, 1.5, 2.5, 0.7, 0.7, 2.0)
        assert torch.allclose(got, torch.tensor(softmax([v / t for v in row])), atol=1e-6)
    # the peaked row hits the upper clamp (1.5 + 0.7 > 2), a flat row the lower one with these parameters
    assert hand_temperature(rows[1], 1.5, 2.5, 0.7, 0.7, 2.0) == 2.0
    flat = EntropyTemperature(t0=1.0, alpha=1.0, theta=0.0, lo=0.5, hi=2.0)
    q_flat = TargetPipeline.build(SamplingConfig(entropy_temperature=flat))(torch.tensor([rows[2:]]))
    assert hand_temperature(rows[2], 1.0, 1.0, 0.0, 0.5, 2.0) == 0.5
    assert torch.allclose(q_flat[0], torch.tensor(softmax([v / 0.5 for v in rows[2]])), atol=1e-6)


def test_entropy_is_taken_after_cfg_and_before_top_k():
    """Rows of ``[cond, uncond]`` logits: CFG, then ``T`` from the full CFG'd row, top-2, static temperature."""
    cond, uncond = [1.0, 0.5, 0.0, -0.5, 0.3], [0.5, 0.5, 0.2, 0.0, 0.0]
    s, static = 2.0, 0.8
    sampling = SamplingConfig(guidance_scale=s, top_k=2, temperature=static, entropy_temperature=EntropyTemperature())
    q = TargetPipeline.build(sampling)(torch.tensor([[cond], [uncond]]))[0]
    cfg = [u + s * (c - u) for c, u in zip(cond, uncond, strict=True)]
    t = hand_temperature(cfg, 1.5, 2.5, 0.7, 0.7, 2.0)
    kept = sorted(range(5), key=lambda v: -cfg[v])[:2]
    expected = [0.0] * 5
    for v, p in zip(kept, softmax([cfg[v] / t / static for v in kept]), strict=True):
        expected[v] = p
    assert torch.allclose(q, torch.tensor(expected), atol=1e-6)
    # T from the top-2 row would differ: the order of the processors matters here
    assert hand_temperature([cfg[v] for v in kept], 1.5, 2.5, 0.7, 0.7, 2.0) != pytest.approx(t)


PROMPT = "a cat"
N_SAMPLES = 2000
TINY = ("model=janus_pro_tiny", "model.grid=2", "model.codebook=3", "model.head_scale=20.0",
        "model.guidance_scale=2.0", "model.seed=1")


@pytest.mark.statistical
def test_sjd_is_exact_for_the_tempered_target():
    """The tiny Janus of test_lossless.py, built from the config with the released parameters: SJD's
    sequences follow the tempered AR distribution, and not the untempered one (the test has power)."""
    cfg = make_cfg(*TINY, f"model.entropy_temperature={RELEASED}")
    validate(cfg)
    adapter = build_adapter(cfg.model, torch.device("cpu"))
    assert adapter.sampling.entropy_temperature == EntropyTemperature()
    tempered = exact_sequence_distribution(adapter, PROMPT)
    plain = exact_sequence_distribution(tiny_janus_adapter(grid=2, codebook=3, head_scale=20.0, guidance_scale=2.0, seed=1), PROMPT)
    assert 0.5 * sum(abs(tempered[k] - plain[k]) for k in plain) > 0.1
    engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=4))
    counts = Counter(tuple(engine.generate(PROMPT, seed=50_000 + s).tokens.tolist()) for s in range(N_SAMPLES))
    assert chi_square_pvalue(counts, tempered) > 1e-3
    assert chi_square_pvalue(counts, plain) < 1e-6


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.5", r"model.entropy_temperature=1.5 must be a mapping with the keys \['t0', 'alpha', 'theta', 'lo', 'hi'\] "
                r"\(or null for off; the released Lumina-mGPT values"),
        ("{t0:1.5,alpha:2.5}", "model.entropy_temperature=.* must be a mapping with the keys"),
        ("{t0:1.5,alpha:0,theta:0.7,lo:0.7,hi:2.0}", "model.entropy_temperature.alpha=0 must be > 0"),
        ("{t0:abc,alpha:2.5,theta:0.7,lo:0.7,hi:2.0}", "model.entropy_temperature.t0='abc' must be a finite number >= 0"),
        ("{t0:1.5,alpha:2.5,theta:0.7,lo:2.0,hi:0.7}", "model.entropy_temperature=.*: needs 0 < lo <= hi, got lo=2.0, hi=0.7"),
    ],
)
def test_bad_values_are_one_line_config_errors(value, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(make_cfg(*TINY, f"model.entropy_temperature={value}"))
    assert "\n" not in str(err.value)


def test_off_by_default():
    cfg = make_cfg(*TINY)
    validate(cfg)
    assert build_adapter(cfg.model, torch.device("cpu")).sampling.entropy_temperature is None
