"""The evaluate stage end to end on a toy-model run, with ``csd.toy`` replaced by small fakes of its API."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from csd.evaluate import evaluate_run, summary_line
from csd.evaluation.clip_score import load_open_clip
from csd.prompts import Prompt
from tests.evaluation.test_eval_clip import tiny_config
from tests.evaluation.test_eval_fixtures import eval_cfg, make_run

SCENES = [{"groups": [{"colour": c, "shape": "square", "count": 1}], "relation": r, "background": b}
          for c, r, b in [("red", None, "plain"), ("red", "left of", "plain"), ("blue", "above", "striped"),
                          ("red", None, "noisy")]]


def render_scene(prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
    """Reference renderer (like ``heldout_scene``): the object fills the left half; returns (image, layout)."""
    img = np.full((32, 32, 3), 20, dtype=np.uint8)
    img[:, :16] = 200 if prompt.meta["groups"][0]["colour"] == "red" else 150
    return img, (img[..., 0] > 100).astype(int)


def generated(i: int) -> np.ndarray:
    img = np.full((32, 32, 3), 20 + i, dtype=np.uint8)
    img[:, :16] = 200 - 5 * i
    return img


@pytest.fixture
def fake_toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``csd.toy.checker`` / ``csd.toy.clip`` as described in the toy API (check_image, segment, ...)."""
    checker = types.ModuleType("csd.toy.checker")

    def check_image(img: np.ndarray, scene: dict) -> dict:
        red = scene["groups"][0]["colour"] == "red"
        asked = scene["relation"] is not None
        return {"object": True, "colour": red, "count": True, "position": not asked or scene["background"] == "plain",
                "overall": red, "relation_asked": asked, "n_detected": 1}

    checker.check_image = check_image
    checker.segment = lambda img: (np.asarray(img).mean(axis=-1) > 128).astype(int)
    checker.background_kind = lambda scene: "smooth" if scene["background"] == "plain" else "textured"
    clip = types.ModuleType("csd.toy.clip")
    cfg = tiny_config(tmp_path)

    def load_toy_clip(device: torch.device):
        torch.manual_seed(0)
        m = load_open_clip("tiny-test-clip", None, device, str(cfg))
        return m.model, m.preprocess, m.tokenizer

    clip.load_toy_clip = load_toy_clip
    monkeypatch.setitem(__import__("sys").modules, "csd.toy.checker", checker)
    monkeypatch.setitem(__import__("sys").modules, "csd.toy.clip", clip)


def test_evaluate_toy_run(tmp_path: Path, fake_toy: None) -> None:
    run = make_run(tmp_path / "csd", method="csd", n_images=4, relaxed_every=4, method_params={"lam": 0.5, "delta": 0.3},
                   metas=SCENES, images=[generated(i) for i in range(4)])
    cfg = eval_cfg(tmp_path, **{"eval.toy.render": "tests.evaluation.test_eval_toy.render_scene"})
    result = evaluate_run(run, cfg)
    on_disk = json.loads((run / "metrics.json").read_text())
    assert on_disk["metrics"] == pytest.approx(result["metrics"], nan_ok=True)
    m = result["metrics"]
    assert result["skipped"] == {}
    assert m["scene_acc_colour"] == 0.75 and m["scene_acc_overall"] == 0.75 and m["scene_acc_count"] == 1.0
    assert m["scene_acc_position"] == 0.5  # over the two prompts that ask for a relation
    regions = result["content"]["regions"]
    # grid column 1 (object half) holds every relaxed accept; column 3 (background) plain accepts
    assert regions["object"] == {"positions": 32, "accepted": 16, "relaxed": 16, "accepted_rate": 0.5, "relaxed_rate": 0.5}
    assert regions["smooth"]["positions"] == 16 and regions["smooth"]["relaxed"] == 0
    assert regions["textured"]["accepted_rate"] == 0.5
    assert 0 <= m["clip_score"] <= 100 and math.isfinite(m["fid"]) and m["fid"] >= 0
    assert result["protocol"]["fid"]["features"] == "toy-clip" and result["protocol"]["fid"]["n_reference"] == 4
    assert len(result["content"]["acceptance_maps"]["accepted"]) == 4
    assert "FID" in summary_line(result) and "csd(" in summary_line(result)
    # a second evaluation reads the cached reference statistics
    assert evaluate_run(run, cfg)["protocol"]["fid"]["reference_cached"]


def test_missing_assets_skip_or_raise(tmp_path: Path) -> None:
    run = make_run(tmp_path / "ar", method="ar", model="janus_pro_tiny", dataset="smoke", n_images=2)
    cfg = eval_cfg(tmp_path, **{"eval.clip.pretrained": str(tmp_path / "missing.bin")})
    result = evaluate_run(run, cfg)
    assert set(result["skipped"]) == {"clip_score", "fid"}
    assert "no FID reference set" in result["skipped"]["fid"]
    assert result["metrics"]["latency_mean"] == pytest.approx(1.0)
    cfg.eval.strict = True
    with pytest.raises(FileNotFoundError, match="eval.clip.pretrained"):
        evaluate_run(run, cfg)


def test_real_toy_references_pass_the_checker(tmp_path: Path) -> None:
    """With the real ``csd.toy``: reference renderings evaluated as a run score (almost) perfectly."""
    domain = pytest.importorskip("csd.toy.domain")
    prompts = domain.toy_prompts(n_prompts=6, split="heldout")
    run = make_run(tmp_path / "ref", method="sjd", n_images=6, grid=(16, 16), metas=[p.meta for p in prompts],
                   images=[domain.heldout_scene(p)[0] for p in prompts])
    cfg = eval_cfg(tmp_path, **{"eval.toy.metrics": ["scene", "regions"]})
    result = evaluate_run(run, cfg)
    assert result["metrics"]["scene_acc_overall"] >= 5 / 6
    regions = result["content"]["regions"]
    assert sum(r["positions"] for r in regions.values()) == 6 * 256 and regions["object"]["positions"] > 0


def test_toy_reference_cache_keys_the_scenes_and_the_feature_weights(tmp_path: Path, fake_toy: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached reference statistics are reused only for the same rendered scenes and the same toy-CLIP weights: a
    renderer whose law changed under the same name, or a retrained toy-CLIP, recomputes them (stale statistics would
    otherwise give a silently wrong FID)."""
    run = make_run(tmp_path / "ar", method="ar", n_images=4, metas=SCENES, images=[generated(i) for i in range(4)])
    cfg = eval_cfg(tmp_path, **{"eval.toy.render": "tests.evaluation.test_eval_toy.render_scene"})

    def cached() -> bool:
        return evaluate_run(run, cfg)["protocol"]["fid"]["reference_cached"]

    assert not cached() and cached()  # filled, then reused
    module = __import__("sys").modules[__name__]
    original = module.render_scene

    def other_law(prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
        image, layout = original(prompt)
        return np.where(layout[..., None] > 0, image, image + 7).astype(np.uint8), layout

    monkeypatch.setattr(module, "render_scene", other_law)
    assert not cached() and cached()  # same renderer name, other scenes
    monkeypatch.setattr(module, "render_scene", original)
    assert cached()  # the original scenes' entry is still there
    clip = __import__("sys").modules["csd.toy.clip"]
    load = clip.load_toy_clip

    def retrained(device: torch.device):
        model, preprocess, tokenizer = load(device)
        with torch.no_grad():
            next(model.parameters()).add_(0.01)
        return model, preprocess, tokenizer

    monkeypatch.setattr(clip, "load_toy_clip", retrained)
    assert not cached() and cached()  # same name "toy-clip", other weights


@pytest.mark.parametrize("progress", [True, False])
def test_engine_progress_switches_every_evaluation_bar(tmp_path: Path, fake_toy: None, capsys: pytest.CaptureFixture,
                                                       progress: bool) -> None:
    """``engine.progress=false`` silences the evaluation's bars (CLIP score, FID, scene checker, regions) as it does
    generation's and decode's; on by default (``conf/engine/default.yaml``)."""
    run = make_run(tmp_path / "csd", method="csd", n_images=4, relaxed_every=4, metas=SCENES,
                   images=[generated(i) for i in range(4)])
    cfg = eval_cfg(tmp_path, **{"eval.toy.render": "tests.evaluation.test_eval_toy.render_scene",
                                "engine.progress": progress})
    capsys.readouterr()
    evaluate_run(run, cfg)
    err = capsys.readouterr().err
    for bar in ("CLIP score", "FID reference", "FID generated", "scene checker", "regions"):
        assert (bar in err) == progress, bar
