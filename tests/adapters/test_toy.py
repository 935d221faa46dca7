"""The embedded toy model: domain, tokenizer, checker, shipped checkpoint, adapter contract, CLIP."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from csd.errors import MissingWeightsError
from csd.toy.checker import background_kind, check_image, detect, segment
from csd.toy.domain import (
    SCENE_KIND_PROBS,
    heldout_prompts,
    heldout_scene,
    parse_caption,
    render_scene,
    sample_spec,
    toy_prompts,
    training_stream,
)
from csd.toy.tokenizer import PatchTokenizer
from tests.helpers import OneImage

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer() -> PatchTokenizer:
    from csd.toy import TOKENIZER_FILE

    return PatchTokenizer.load(TOKENIZER_FILE)


@pytest.fixture(scope="module")
def adapter_cfg():
    from csd.adapters.toy import load_toy_adapter

    return load_toy_adapter(guidance_scale=3.0)


@pytest.fixture(scope="module")
def heldout_images() -> tuple[list, np.ndarray]:
    prompts = heldout_prompts(64)
    return prompts, np.stack([heldout_scene(p)[0] for p in prompts])


def test_scene_generation_is_deterministic() -> None:
    assert heldout_prompts(8) == heldout_prompts(8)
    assert heldout_prompts(4) == heldout_prompts(8)[:4]
    a, b = heldout_scene(heldout_prompts(3)[2]), heldout_scene(heldout_prompts(3)[2])
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    rng = np.random.default_rng(3)
    for _ in range(100):
        spec = sample_spec(rng)
        assert parse_caption(spec.caption()) == spec
        image, layout = render_scene(spec, rng)
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8
        assert set(np.unique(layout)) == set(range(spec.n_objects + 1))
    assert [p.prompt_id for p in toy_prompts(3)] == ["toy-0000", "toy-0001", "toy-0002"]
    assert toy_prompts(2, split="train")[0].prompt_id == "toy-train-0000"
    with pytest.raises(ValueError):
        toy_prompts(2, split="val")


def test_training_mix_reweights_caption_kinds() -> None:
    """A phase mix (train_toy.py ``steps:lr:mix``) changes which caption kinds the stream draws."""
    specs, _ = next(training_stream(0, 64, kind_probs=(0.0, 0.0, 1.0, 0.0)))
    assert all(len(s.groups) == 2 and s.relation is not None for s in specs)
    specs, _ = next(training_stream(0, 64, kind_probs=(1.0, 0.0, 0.0, 0.0)))
    assert all(s.n_objects == 1 for s in specs)
    rng = np.random.default_rng(0)
    relational = np.mean([sample_spec(rng).relation is not None for _ in range(2000)])
    assert abs(relational - SCENE_KIND_PROBS[2]) < 0.04  # the default (held-out) mix


def test_eval_buckets_prompts_by_caption_kind() -> None:
    """train_toy.py's per-kind pass counts: every held-out prompt lands in the bucket its caption asks for."""
    from experiments.train_toy import caption_kind

    kinds = {p.text: caption_kind(p.meta) for p in heldout_prompts(64)}
    assert set(kinds.values()) == {"one object", "counted group", "and", "left of / right of", "above / below"}
    for text, kind in kinds.items():
        words = text.split()
        if kind == "and":
            assert "and" in words
        elif kind == "left of / right of":
            assert "left" in words or "right" in words
        elif kind == "above / below":
            assert "above" in words or "below" in words
        else:
            assert not {"and", "left", "right", "above", "below"} & set(words)
            assert (words[0] == "a") == (kind == "one object")


def test_tokenizer_round_trip(tokenizer: PatchTokenizer, heldout_images) -> None:
    _, images = heldout_images
    codes = tokenizer.encode(images)
    assert codes.shape == (64, 256) and 0 <= int(codes.min()) and int(codes.max()) < tokenizer.vocab_size
    recon = tokenizer.decode(codes)
    assert recon.dtype == torch.uint8 and recon.shape == (64, 32, 32, 3)
    assert np.abs(recon.numpy().astype(float) - images).mean() < 8.0
    assert torch.equal(tokenizer.encode(recon), codes)  # decoded centroids re-encode to themselves


def test_checker_accepts_real_rejects_random(tokenizer: PatchTokenizer, heldout_images) -> None:
    prompts, images = heldout_images
    recon = tokenizer.decode(tokenizer.encode(images)).numpy()
    assert np.mean([check_image(im, p.meta)["overall"] for im, p in zip(recon, prompts, strict=True)]) >= 0.95
    assert all(check_image(im, p.text)["overall"] for im, p in zip(images, prompts, strict=True))
    noise = tokenizer.decode(torch.randint(0, tokenizer.vocab_size, (64, 256),
                                           generator=torch.Generator().manual_seed(0))).numpy()
    assert np.mean([check_image(im, p.meta)["overall"] for im, p in zip(noise, prompts, strict=True)]) <= 0.10


def test_segment_matches_ground_truth_layout(heldout_images) -> None:
    prompts, images = heldout_images
    for p, image in zip(prompts[:16], images[:16], strict=True):
        truth = heldout_scene(p)[1]
        labels = segment(image)
        assert labels.max() == len(detect(image)) == truth.max()
        assert np.array_equal(labels > 0, truth > 0)
        assert background_kind(p.text) == background_kind(p.meta) == p.meta["background_kind"]


def test_adapter_contract(adapter_cfg) -> None:
    a = adapter_cfg
    v = a.vocab_size
    assert a.layout.length == 256 and a.layout.grid == (16, 16)
    assert torch.equal(a.image_token_ids, torch.arange(v))
    assert a.codebook().shape == (v, 12) and a.token_embeddings().shape[0] == v
    assert a.describe()["guidance_scale"] == 3.0
    assert a.describe()["token_ids"] == {"image": [0, v - 1], "forced": []}
    caption = heldout_prompts(1)[0].text
    ids = torch.randint(0, v, (12,), generator=torch.Generator().manual_seed(1))

    window_ctx = OneImage(a, caption)
    window = window_ctx.forward(ids, with_prompt_tail=True)
    assert window.shape == (2, 13, v)

    step_ctx = OneImage(a, caption)
    steps = [step_ctx.forward(ids[:0], with_prompt_tail=True)]
    steps += [step_ctx.forward(ids[i:i + 1]) for i in range(len(ids))]
    torch.testing.assert_close(window, torch.cat(steps, dim=1), atol=1e-4, rtol=0)

    # roll back the last 7 of the 13 window entries, then continue with other tokens
    window_ctx.rollback(7)
    window_ctx.rollback(0)
    more = torch.randint(0, v, (4,), generator=torch.Generator().manual_seed(2))
    continued = window_ctx.forward(more)
    fresh_ctx = OneImage(a, caption)
    fresh = fresh_ctx.forward(torch.cat([ids[:5], more]), with_prompt_tail=True)
    torch.testing.assert_close(continued, fresh[:, -4:], atol=1e-4, rtol=0)
    assert window_ctx.batch.cache.filled == fresh_ctx.batch.cache.filled


def test_cfg_rows_are_cond_then_null_caption(adapter_cfg) -> None:
    from csd.adapters.base import SamplingConfig
    from csd.adapters.toy import ToyAdapter

    plain = ToyAdapter(adapter_cfg.lm, adapter_cfg.tokenizer, SamplingConfig(guidance_scale=1.0))
    caption = heldout_prompts(2)[1].text
    ids = torch.tensor([3, 7, 11])
    both = OneImage(adapter_cfg, caption).forward(ids, with_prompt_tail=True)
    cond = OneImage(plain, caption).forward(ids, with_prompt_tail=True)
    uncond = OneImage(plain, "").forward(ids, with_prompt_tail=True)
    assert cond.shape[0] == 1
    torch.testing.assert_close(both, torch.cat([cond, uncond]), atol=1e-4, rtol=0)
    assert not torch.allclose(cond, uncond, atol=1e-2)
    images = plain.decode_images(torch.zeros(2, 256, dtype=torch.long))
    assert images.shape == (2, 32, 32, 3) and images.dtype == torch.uint8


def test_missing_weights_error(monkeypatch, tmp_path) -> None:
    import csd.adapters.toy as toy_adapter

    monkeypatch.setattr(toy_adapter.ToyAdapter, "checkpoint", tmp_path / "lm")
    with pytest.raises(MissingWeightsError, match="python -m experiments.train_toy"):
        toy_adapter.load_toy_adapter()
    monkeypatch.setattr(toy_adapter.TexturedToyAdapter, "checkpoint", tmp_path / "textured")
    with pytest.raises(MissingWeightsError, match=r"toy_textured model files missing: .*textured/config.json.*"
                                                  r"the textured recipe of `python -m experiments.train_toy`"):
        toy_adapter.load_toy_textured_adapter()
    monkeypatch.setattr(toy_adapter.OutlineToyAdapter, "checkpoint", tmp_path / "outline")
    with pytest.raises(MissingWeightsError, match=r"toy_textured_outline model files missing: .*outline/config.json.*"
                                                  r"the outline recipe of `python -m experiments.train_toy`"):
        toy_adapter.load_toy_textured_outline_adapter()


def test_clip_loads_through_open_clip(tokenizer: PatchTokenizer, heldout_images) -> None:
    from PIL import Image

    from csd.toy.clip import clip_scores, image_tensor, load_toy_clip

    model, preprocess, clip_tokenizer = load_toy_clip()
    prompts, images = heldout_images
    recon = tokenizer.decode(tokenizer.encode(images[:32])).numpy()
    torch.testing.assert_close(preprocess(Image.fromarray(recon[0])), image_tensor(recon[:1])[0])
    captions = [p.text for p in prompts[:32]]
    matched = clip_scores(model, clip_tokenizer, recon, captions)
    shuffled = clip_scores(model, clip_tokenizer, recon, captions[7:] + captions[:7])
    assert matched.mean() > shuffled.mean() + 5


@pytest.mark.slow
def test_training_script_trains_continues_and_saves(tmp_path) -> None:
    """experiments/train_toy.py end to end on a tiny LM (compiled loss): log rows, a loadable checkpoint, a
    continued phase."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from csd.toy import ASSETS
    from csd.toy.model import load_toy_lm

    repo = Path(__file__).resolve().parents[2]
    shutil.copy(ASSETS / "tokenizer.safetensors", tmp_path)
    log = tmp_path / "log.csv"
    base = [sys.executable, "-m", "experiments.train_toy", "--stages", "lm", "--out", str(tmp_path),
            "--log", str(log), "--hidden", "32", "--layers", "1", "--heads", "2", "--batch", "2", "--phases", "4:1e-3",
            "--log-every", "2"]
    subprocess.run([*base, "--compile", "--rope-theta", "42"], check=True, capture_output=True, cwd=repo)
    subprocess.run([*base, "--init-lm", str(tmp_path / "lm"), "--phases", "2:1e-3,2:5e-4:0/0/1/0"], check=True,
                   capture_output=True, cwd=repo)
    rows = [line.split(",") for line in log.read_text().splitlines()]
    assert rows[0][:3] == ["phase", "step", "loss"]
    assert [(r[0], r[1]) for r in rows[1:]] == [("1", "2"), ("1", "4"), ("2", "2"), ("3", "2")]
    assert all(0 < float(r[2]) < 10 for r in rows[1:])
    lm = load_toy_lm(tmp_path / "lm")
    assert lm.config.hidden_size == 32 and lm.config.num_hidden_layers == 1
    assert lm.config.rope_parameters["rope_theta"] == 42


def test_toy_draft_is_an_early_exit_of_the_toy() -> None:
    """model=toy_draft: the toy's first decoder layer, then its final norm and head, with the toy's own weights."""
    from csd.adapters.toy import load_toy_adapter, load_toy_draft_adapter

    toy, draft = load_toy_adapter(), load_toy_draft_adapter(layers=1)
    assert len(draft.lm.model.layers) == draft.decoder().config.num_hidden_layers == 1
    ids = toy.prompt_inputs("two red circles")[:1]
    with torch.no_grad():
        embeds = toy.lm.model.embed_tokens(ids)
        positions = torch.arange(ids.shape[1])[None]
        hidden = toy.lm.model.layers[0](embeds, position_embeddings=toy.lm.model.rotary_emb(embeds, positions),
                                        attention_mask=None, position_ids=positions)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        early = toy.lm.lm_head(toy.lm.model.norm(hidden))[..., -draft.vocab_size:]
        torch.testing.assert_close(draft.decode_step(ids, None, positions, None), early)
    with pytest.raises(ValueError, match=r"model.layers=6: the toy has 6 decoder layers; .* keeps 1 .. 5"):
        load_toy_draft_adapter(layers=6)
