"""The textured styles of the toy domain (model=toy_textured's data, the outline candidate's) and train_toy.py's
resumable training."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from csd.toy.checker import check_image
from csd.toy.domain import (
    TEXTURE_TEMPERATURE,
    SceneSpec,
    _background,
    _cells,
    _place,
    _texture,
    heldout_prompts,
    heldout_scene,
    heldout_scene_textured,
    heldout_scene_textured_outline,
    neutral_patterns,
    render_scene,
    texture_law,
)
from csd.toy.tokenizer import PatchTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tokenizer() -> PatchTokenizer:
    from csd.toy import TOKENIZER_FILE

    return PatchTokenizer.load(TOKENIZER_FILE)


def test_neutral_patterns_are_the_codebooks_background_codes(tokenizer) -> None:
    patterns = neutral_patterns()
    assert patterns.shape == (29, 12)
    tiles = torch.from_numpy(patterns).float().reshape(-1, 2, 2, 3).repeat(1, 16, 16, 1)  # each pattern, everywhere
    codes = tokenizer.encode(tiles)
    # every pattern is a codebook entry: tiling it encodes to one code everywhere, decoding gives it back
    assert (codes == codes[:, :1]).all()
    assert np.allclose(tokenizer.centroids[codes[:, 0]].numpy(), patterns, atol=1e-4)


def test_texture_law_is_a_boltzmann_law_around_the_clean_cell() -> None:
    rng = np.random.default_rng(0)
    clean = _background("striped", rng)
    law = texture_law(clean, "striped")
    assert law.shape == (256, len(neutral_patterns())) and np.allclose(law.sum(1), 1.0)
    rms = np.sqrt(((_cells(clean)[:, None, :] - neutral_patterns()[None]) ** 2).mean(-1))
    # log-odds of any two patterns are their RMS distances' difference over T
    t = TEXTURE_TEMPERATURE["striped"]
    assert np.allclose(np.log(law[:, 3] / law[:, 7]), (rms[:, 7] - rms[:, 3]) / t, atol=1e-6)
    assert (law.argmax(1) == rms.argmin(1)).all()  # the nearest pattern is the likeliest


def test_texture_draws_follow_the_law() -> None:
    """Frequencies of one cell's pattern over 3000 draws match its law (each within 4.5 standard errors); a draw from
    the law of another background (negative control) does not."""
    clean = _background("plain", np.random.default_rng(1))
    law = texture_law(clean, "plain")[0]
    other = texture_law(clean, "noisy")[0]
    patterns = neutral_patterns()
    n = 3000
    first = np.stack([_cells(_texture(clean, "plain", np.random.default_rng([5, i])))[0] for i in range(n)])
    index = np.abs(first[:, None, :] - patterns[None]).sum(-1).argmin(1)
    freq = np.bincount(index, minlength=len(patterns)) / n
    se = np.sqrt(law * (1 - law) / n) + 1e-3
    assert (np.abs(freq - law) < 4.5 * se).all()
    assert (np.abs(freq - other) > 4.5 * (np.sqrt(other * (1 - other) / n) + 1e-3)).any()


def test_textured_references_keep_the_scene_and_randomise_only_the_background(tokenizer) -> None:
    prompts = heldout_prompts(64)
    passed = []
    for p in prompts:
        image, layout = heldout_scene_textured(p)
        clean_image, clean_layout = heldout_scene(p)
        assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
        background = _cells(layout[..., None]).max(1) == 0
        # background cells are neutral codebook patterns, so they encode exactly
        recon = tokenizer.decode(tokenizer.encode(image[None]))[0].numpy()
        assert np.abs(_cells(recon)[background].astype(int) - _cells(image)[background]).max() <= 1
        # objects are drawn exactly as in the clean style (same shapes, same colours)
        assert len(np.unique(layout)) == len(np.unique(clean_layout))
        passed.append(check_image(recon, p.meta)["overall"])
    assert np.mean(passed) >= 0.97
    assert np.array_equal(heldout_scene(prompts[0])[0], render_scene(SceneSpec.from_meta(prompts[0].meta),
                                                                     np.random.default_rng(prompts[0].meta["render_seed"]))[0])


def test_textured_body_entropy_is_near_three_tenths_of_log_v() -> None:
    """The chosen temperatures: the law's mean entropy over the body (object cells count 0) is 0.285 of log V on the
    first 400 held-out prompts (csd/toy/MODEL_CARD.md); 64 prompts land near it."""
    values = []
    for p in heldout_prompts(64):
        spec = SceneSpec.from_meta(p.meta)
        rng = np.random.default_rng(p.meta["render_seed"])
        law = texture_law(_background(spec.background, rng), spec.background)
        layout = heldout_scene_textured(p)[1]
        entropy = -(law * np.log(law)).sum(1) * (_cells(layout[..., None]).max(1) == 0)
        values.append(entropy.mean() / np.log(256))
    assert 0.25 < np.mean(values) < 0.33


def test_unknown_style_is_refused_in_one_line() -> None:
    spec = SceneSpec.from_meta(heldout_prompts(1)[0].meta)
    with pytest.raises(ValueError, match=r"style='wavy': the toy domain has styles clean, textured, textured_outline$"):
        render_scene(spec, np.random.default_rng(0), "wavy")


def test_outline_style_flips_half_the_band_strictly_inside_each_box() -> None:
    """``textured_outline`` draws the textured scene (same background, texture and boxes: its draws come after the
    placement) and then flips, with probability 1/2, each pixel of an object's one-pixel band (4-neighbour dilation
    minus erosion) strictly inside its box: nothing else changes, squares stay exact, the flipped share is 1/2
    (within 4 standard errors), and the scene checker still passes."""
    from scipy import ndimage

    cross = ndimage.generate_binary_structure(2, 1)
    band_pixels = flipped = 0
    passed = []
    for p in heldout_prompts(200):
        image, layout = heldout_scene_textured_outline(p)
        base_image, base_layout = heldout_scene_textured(p)
        spec = SceneSpec.from_meta(p.meta)
        rng = np.random.default_rng(p.meta["render_seed"])  # render_scene's draws up to the placement
        _texture(_background(spec.background, rng), spec.background, rng)
        boxes = _place(spec, rng)
        shapes = [g.shape for g in spec.groups for _ in range(g.count)]
        allowed = np.zeros_like(layout, dtype=bool)
        for k, (shape, (x, y, size)) in enumerate(zip(shapes, boxes, strict=True), start=1):
            obj = base_layout == k
            band = ndimage.binary_dilation(obj, cross) & ~ndimage.binary_erosion(obj, cross)
            inner = np.zeros_like(obj)
            inner[y + 1:y + size - 1, x + 1:x + size - 1] = True
            band &= inner
            if shape == "square":
                assert not band.any()
            changed = (layout == k) != obj
            assert not (changed & ~band).any()  # only the band strictly inside the box flips
            band_pixels += int(band.sum())
            flipped += int(changed.sum())
            allowed |= band
        assert np.array_equal(image[~allowed], base_image[~allowed])
        passed.append(check_image(image, p.meta)["overall"])
    share = flipped / band_pixels
    assert abs(share - 0.5) < 4 * np.sqrt(0.25 / band_pixels)
    assert np.mean(passed) >= 0.97


def _train(monkeypatch, tmp_path, *extra: str) -> None:
    from csd.toy import LM_DIR
    from experiments import train_toy

    monkeypatch.setattr(sys, "argv", [
        "train_toy", "--stages", "lm", "--style", "textured", "--init-lm", str(LM_DIR), "--out", str(tmp_path),
        "--log", str(tmp_path / "log.csv"), "--phases", "3:4e-4,3:2e-4", "--batch", "2", "--log-every", "1",
        "--save-every", "2", *extra])
    train_toy.main()


@pytest.mark.slow
def test_an_interrupted_training_resumes_to_the_same_weights(monkeypatch, tmp_path) -> None:
    """Stopped inside the second phase and continued with --resume, the LM and its loss log equal an uninterrupted
    run's (model, optimiser, schedule, data stream and caption dropout restored)."""
    from safetensors.torch import load_file

    from experiments import train_toy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _train(monkeypatch, tmp_path / "full")
        calls = {"n": 0}
        loss = train_toy.image_loss

        def stopping(model, ids):
            calls["n"] += 1
            if calls["n"] == 6:  # the third step of phase 2, after its state was saved at step 2
                raise KeyboardInterrupt
            return loss(model, ids)

        monkeypatch.setattr(train_toy, "image_loss", stopping)
        with pytest.raises(KeyboardInterrupt):
            _train(monkeypatch, tmp_path / "cut")
        assert (tmp_path / "cut" / train_toy.STATE_FILE).exists()
        monkeypatch.setattr(train_toy, "image_loss", loss)
        _train(monkeypatch, tmp_path / "cut", "--resume")
    finally:
        torch.set_num_threads(threads)
    assert not (tmp_path / "cut" / train_toy.STATE_FILE).exists()
    full, cut = (load_file(str(tmp_path / d / "lm" / "model.safetensors")) for d in ("full", "cut"))
    assert all(torch.equal(full[k], cut[k]) for k in full)

    def rows(d: str) -> list[list[str]]:
        return [r.split(",")[:5] for r in (tmp_path / d / "log.csv").read_text().splitlines()]  # without elapsed_s

    assert rows("full") == rows("cut") and len(rows("full")) == 7


def test_resume_without_a_saved_state_is_refused(monkeypatch, tmp_path) -> None:
    with pytest.raises(SystemExit, match="--resume: no .*train_state.pt"):
        _train(monkeypatch, tmp_path, "--resume")


@pytest.mark.parametrize(("model", "render"), [("toy_textured", "csd.toy.domain.heldout_scene_textured"),
                                              ("toy_textured_outline", "csd.toy.domain.heldout_scene_textured_outline")])
def test_the_textured_model_preset_composes_with_its_own_fid_reference(model: str, render: str) -> None:
    """model=toy_textured / toy_textured_outline: a toy model for the evaluation (scene checker, toy-CLIP), its FID
    reference its own style's rendering by default, and the render key not passed to the loader."""
    from csd.compose import loader_params
    from csd.validate import validate
    from tests.pipeline.test_config import make_cfg

    cfg = make_cfg(f"model={model}")
    validate(cfg)
    assert cfg.model.name in cfg.eval.toy.models
    assert cfg.eval.toy.render == render
    assert "reference_render" not in loader_params(cfg.model)
    assert make_cfg("model=toy").eval.toy.render == "csd.toy.domain.heldout_scene"
    assert make_cfg("model=toy_textured", "eval.toy.render=csd.toy.domain.heldout_scene").eval.toy.render == \
        "csd.toy.domain.heldout_scene"


def _fake_run(tmp_path, prompts, tokenizer) -> None:
    """A finished AR run of the toy on ``prompts``: their reference scenes' tokens, entropy 1 nat on cells an object
    fills, 2 on boundary cells, 3 on background cells (by the reference layout), images decoded from the tokens."""
    import json

    from PIL import Image

    from csd.evaluation.toy import cell_regions
    from csd.toy.checker import segment

    (tmp_path / "images").mkdir(parents=True)
    with open(tmp_path / "records.jsonl", "w") as f:
        for p in prompts:
            tokens = tokenizer.encode(heldout_scene(p)[0][None])[0]
            decoded = tokenizer.decode(tokens[None])[0].numpy()
            regions = cell_regions(segment(decoded), (16, 16))
            entropy = (regions + 1.0).reshape(-1)
            name = f"images/{p.prompt_id}_s0.png"
            Image.fromarray(decoded).save(tmp_path / name)
            f.write(json.dumps({"prompt_id": p.prompt_id, "prompt": p.text, "sample": 0, "seed": 0, "method": "ar",
                                "model": "toy", "meta": p.meta, "image": name, "tokens": tokens.tolist(),
                                "grid": [16, 16], "commit_kind": [0] * 256, "entropy": entropy.tolist()}) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"model": "toy", "model_info": {"vocab_size": 256}}))


def test_entropy_by_region_splits_object_edge_and_background_cells(tmp_path, tokenizer) -> None:
    """experiments.entropy_map on a run whose entropy is 1 / 2 / 3 nats on object / edge / background cells: each
    region's mean is exactly its value, the shares add up to 1, the body mean is their share-weighted sum; images
    are read from the files or, when missing, decoded from the tokens (same numbers)."""
    import math

    from csd.evaluation.toy import cell_regions
    from experiments.entropy_map import summarise

    labels = np.zeros((32, 32), dtype=int)
    labels[4:8, 4:8] = 1
    labels[9, 9] = 2
    regions = cell_regions(labels, (16, 16))
    assert (regions[2:4, 2:4] == 0).all() and regions[4, 4] == 1 and (regions == 1).sum() == 1
    assert (regions == 2).sum() == 256 - 5

    _fake_run(tmp_path / "run", heldout_prompts(6), tokenizer)
    out = summarise(tmp_path / "run", n_boot=50)
    log_v = math.log(256)
    for k, name in enumerate(("object", "edge", "background"), start=1):
        assert out[name]["value"] == pytest.approx(k / log_v)
        assert out[name]["interval"][0] == pytest.approx(k / log_v)
    shares = [out[n]["share"] for n in ("object", "edge", "background")]
    assert sum(shares) == pytest.approx(1.0) and min(shares) > 0
    assert out["body"]["value"] == pytest.approx(sum(s * k for k, s in enumerate(shares, start=1)) / log_v)
    for png in (tmp_path / "run" / "images").iterdir():
        png.unlink()
    assert summarise(tmp_path / "run", n_boot=0)["body"]["value"] == pytest.approx(out["body"]["value"])


def test_the_textured_model_ships_no_spatial_heads_and_says_so_in_one_line() -> None:
    from csd.errors import ConfigError
    from csd.validate import validate
    from tests.pipeline.test_config import make_cfg

    validate(make_cfg("model=toy_textured", "drafter=eagle", "method=sjd"))  # its own EAGLE head
    with pytest.raises(ConfigError) as err:
        validate(make_cfg("model=toy_textured", "drafter=ssd", "method=sjd", "engine.batch_size=1"))
    assert "\n" not in str(err.value) and "TexturedToyAdapter ships no spatial heads" in str(err.value)


@pytest.mark.slow
def test_the_textured_model_drafts_with_its_own_eagle_head() -> None:
    """``drafter=eagle`` on the textured toy loads the head trained on its LM, which drafts its texture: over four
    held-out prompts SJD commits more tokens per target forward with it than with the clean toy's head (measured
    3.53 against 2.16)."""
    from csd.acceptance import SJD
    from csd.adapters.toy import load_toy_textured_adapter
    from csd.drafters.eagle import EagleDrafter
    from csd.engine import JacobiEngine
    from csd.toy import EAGLE_HEAD_FILE, TEXTURED_EAGLE_HEAD_FILE

    adapter = load_toy_textured_adapter()
    assert adapter.eagle_head == TEXTURED_EAGLE_HEAD_FILE
    prompts = [p.text for p in heldout_prompts()[:4]]

    def compression(head) -> float:
        engine = JacobiEngine(adapter, SJD(), EagleDrafter(window=5, head=head))
        runs = [engine.generate(text, seed=i) for i, text in enumerate(prompts)]
        return sum(len(r.tokens) for r in runs) / sum(r.nfe for r in runs)

    assert compression(None) > 3.0 > 2.5 > compression(str(EAGLE_HEAD_FILE))  # None: the adapter's eagle_head


def test_an_evaluation_outside_the_shipped_assets_writes_its_sample_grid_beside_its_metrics(monkeypatch,
                                                                                            tmp_path) -> None:
    """``--stages eval`` of a checkpoint trained elsewhere (a candidate's ``--out``) writes its sample grid into that
    directory, next to its metrics.json, and leaves the repository's results/ alone: only the shipped assets'
    evaluation (``--out`` = the style's shipped directory) refreshes the grid committed under results/."""
    import shutil

    from csd.toy import LM_DIR
    from experiments import train_toy

    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    monkeypatch.setattr(train_toy, "REPO", repo)
    out = tmp_path / "candidate"
    shutil.copytree(LM_DIR, out / "lm")
    monkeypatch.setattr(sys, "argv", [
        "train_toy", "--stages", "eval", "--style", "textured", "--out", str(out), "--eval-prompts", "2",
        "--eval-seeds", "1", "--guidance-sweep", "--threads", "1"])
    threads = torch.get_num_threads()
    try:
        train_toy.main()
    finally:
        torch.set_num_threads(threads)
    assert (out / "metrics.json").exists() and (out / "samples_ar.png").exists()
    assert list((repo / "results").iterdir()) == []
    from csd.toy import ASSETS, TEXTURED_DIR

    assert train_toy.sample_grid_path(TEXTURED_DIR, "textured") == repo / "results" / "toy_textured_samples_ar.png"
    assert train_toy.sample_grid_path(ASSETS, "clean") == repo / "results" / "toy_samples_ar.png"
    assert train_toy.sample_grid_path(ASSETS, "textured") == ASSETS / "samples_ar.png"


def test_a_training_outside_the_shipped_assets_logs_its_losses_beside_its_checkpoint(monkeypatch, tmp_path) -> None:
    """Without ``--log``, a run whose ``--out`` is not the style's shipped directory logs into ``--out`` (a candidate
    never appends to the committed loss log); the shipped directories keep their committed logs."""
    from csd.toy import ASSETS, TEXTURED_DIR
    from experiments import train_toy

    def log_of(*argv: str) -> object:
        monkeypatch.setattr(sys, "argv", ["train_toy", *argv])
        return train_toy.parse_args().log

    results = train_toy.REPO / "results"
    assert log_of("--out", str(tmp_path), "--style", "textured") == tmp_path / "training_log.csv"
    assert log_of("--out", str(tmp_path)) == tmp_path / "training_log.csv"
    assert log_of() == results / "toy_training_log.csv"
    assert log_of("--out", str(ASSETS)) == results / "toy_training_log.csv"
    assert log_of("--out", str(TEXTURED_DIR), "--style", "textured") == results / "toy_textured_training_log.csv"
    assert log_of("--out", str(tmp_path), "--log", str(tmp_path / "x.csv")) == tmp_path / "x.csv"
