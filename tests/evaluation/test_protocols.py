"""Published evaluation protocols: image steps against hand-computed or library-direct
expectations, COCO caption rules on a synthetic annotation file, and the presets' settings in metrics.json."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from omegaconf import OmegaConf
from PIL import Image
from torch import nn

from csd.data.coco import CAPTION_RULES as COCO_RULES
from csd.data.coco import coco2017_prompts
from csd.errors import ConfigError, DatasetFileError
from csd.evaluate import evaluate_run
from csd.evaluation.clip_score import CLAMPS, load_open_clip
from csd.evaluation.fid import module_fid
from csd.evaluation.images import Preprocess
from csd.keys import CAPTION_RULES
from csd.registry import step_error
from csd.validate import validate
from tests.evaluation.test_eval_clip import tiny_config
from tests.evaluation.test_eval_fixtures import make_run
from tests.pipeline.test_config import make_cfg


def ramp(h: int = 4, w: int = 6) -> np.ndarray:
    """R = 40 r + 10 c (a plane, so bilinear interpolation reproduces it exactly), G = 255 - R, B = 7."""
    r, c = np.mgrid[0:h, 0:w]
    red = 40 * r + 10 * c
    return np.stack([red, 255 - red, np.full_like(red, 7)], axis=2).astype(np.uint8)


def run_steps(steps: tuple[str, ...], pixels: np.ndarray) -> np.ndarray:
    return np.asarray(Preprocess(steps)(Image.fromarray(pixels)))


def test_crop_long_edge_takes_torchvision_offsets() -> None:
    img = ramp()  # 4 x 6: a 4 x 4 square, (6 - 4) / 2 = 1 column off the left
    np.testing.assert_array_equal(run_steps(("crop_long_edge",), img), img[:, 1:5])
    wide, tall = ramp(5, 8), ramp(8, 5)  # offset (8 - 5) / 2 = 1.5, rounded half to even: 2
    np.testing.assert_array_equal(run_steps(("crop_long_edge",), wide), wide[:, 2:7])
    np.testing.assert_array_equal(run_steps(("crop_long_edge",), tall), tall[2:7])
    for pixels in (img, wide, tall):  # LANTERN's own call
        expected = np.asarray(TF.center_crop(Image.fromarray(pixels), min(pixels.shape[:2])))
        np.testing.assert_array_equal(run_steps(("crop_long_edge",), pixels), expected)
    np.testing.assert_array_equal(run_steps(("center_crop:2",), img), img[1:3, 2:4])


def test_bilinear_stretches_with_half_pixel_centres() -> None:
    img = ramp()
    # 4 x 6 -> 2 x 2: source rows (i + 0.5) * 2 - 0.5 = 0.5, 2.5; columns (j + 0.5) * 3 - 0.5 = 1, 4
    out = run_steps(("bilinear:2",), img)
    red = np.array([[40 * 0.5 + 10 * 1, 40 * 0.5 + 10 * 4], [40 * 2.5 + 10 * 1, 40 * 2.5 + 10 * 4]])
    np.testing.assert_array_equal(out[..., 0], red)  # [[30, 60], [110, 140]]
    np.testing.assert_array_equal(out[..., 1], 255 - red)
    np.testing.assert_array_equal(out[..., 2], 7)
    # 4 x 6 -> 299 x 299 (stretched, nothing cropped): the plane at the clamped source coordinates, rounded
    out = run_steps(("bilinear:299",), img).astype(float)
    rows = np.clip((np.arange(299) + 0.5) * 4 / 299 - 0.5, 0, 3)
    cols = np.clip((np.arange(299) + 0.5) * 6 / 299 - 0.5, 0, 5)
    expected = 40 * rows[:, None] + 10 * cols[None, :]
    assert out.shape == (299, 299, 3)
    assert np.abs(out[..., 0] - expected).max() <= 0.5 + 1e-3
    assert out[0, 0, 0] == 0 and out[-1, -1, 0] == 170  # the corners reach the image's corners: a stretch


def test_lanczos_and_clean_bicubic_match_pil() -> None:
    img = ramp()
    square = Image.fromarray(np.ascontiguousarray(img[:, 1:5]))
    lanczos = np.asarray(square.resize((256, 256), Image.LANCZOS))
    out = run_steps(("crop_long_edge", "lanczos:256"), img)
    np.testing.assert_array_equal(out, lanczos)
    # clean-fid's "clean" resize: each channel as a float image, PIL bicubic, clipped; rounded here
    channels = [np.asarray(Image.fromarray(lanczos[..., c].astype(np.float32)).resize((299, 299), Image.BICUBIC))
                for c in range(3)]
    clean = np.rint(np.clip(np.stack(channels, axis=2), 0, 255)).astype(np.uint8)
    np.testing.assert_array_equal(run_steps(("crop_long_edge", "lanczos:256", "clean_bicubic:299"), img), clean)


def test_pil_bilinear_is_torchvisions_resize_of_a_pil_image() -> None:
    """LANTERN's precision / recall resize, ``transforms.Resize([224, 224])`` on the PIL image."""
    from torchvision import transforms

    for h, w in ((30, 50), (300, 256)):
        pixels = np.random.default_rng(h).integers(0, 256, (h, w, 3), dtype=np.uint8)
        expected = np.asarray(transforms.Resize([224, 224])(Image.fromarray(pixels)))
        np.testing.assert_array_equal(run_steps(("pil_bilinear:224",), pixels), expected)


def test_torchmetrics_resize_leaves_299_inputs_alone() -> None:
    """torchmetrics' Inception resizes to 299 x 299 itself (bilinear, antialiased by default): on the
    presets' 299 x 299 images that is the identity, so their own resize is the one that counts."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    assert inspect.signature(FrechetInceptionDistance).parameters["antialias"].default is True
    x = torch.randint(0, 256, (2, 3, 299, 299)).float()
    y = nn.functional.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False, antialias=True)
    assert torch.equal(x, y)


def test_step_strings_are_checked() -> None:
    assert step_error("lanczos:256") is None and step_error("crop_long_edge") is None
    assert "needs a size" in step_error("bilinear")
    assert "takes no size" in step_error("crop_long_edge:3")
    assert "unknown image step 'bicubic:3'" in step_error("bicubic:3")
    with pytest.raises(ValueError, match="needs a size"):
        Preprocess(("lanczos:0",))
    with pytest.raises(ValueError, match="cannot centre-crop 5 px from a 6x4 image"):
        run_steps(("center_crop:5",), ramp())


# ---- COCO caption rules --------------------------------------------------------------------------

ANNOTATIONS = [  # file order; per image: 1 -> 11, 12, 13; 2 -> 21, 22, 23; 3 -> 31, 32
    {"id": 31, "image_id": 3, "caption": "a"},
    {"id": 11, "image_id": 1, "caption": "a cat"},
    {"id": 12, "image_id": 1, "caption": "a black cat  "},  # 13 raw characters, 11 stripped
    {"id": 13, "image_id": 1, "caption": "a black cats"},   # 12
    {"id": 32, "image_id": 3, "caption": "a very long caption here"},  # 24
    {"id": 21, "image_id": 2, "caption": "two dogs run"},   # 12
    {"id": 22, "image_id": 2, "caption": "dog"},
    {"id": 23, "image_id": 2, "caption": "six cats ran"},   # 12, a tie with 21: the first stays
]


def write_annotations(path: Path, annotations: list[dict] = ANNOTATIONS) -> Path:
    images = [{"id": i, "file_name": f"{i:012d}.jpg"} for i in (3, 1, 2, 4)]  # image 4 has no caption
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


def prompts(path: Path, rule: str, n: int | None = None) -> list[tuple[str, str]]:
    return [(p.prompt_id, p.text) for p in coco2017_prompts(path, n_prompts=n, caption_rule=rule)]


def test_longest_rule_strips_and_keeps_the_first_on_ties(tmp_path: Path) -> None:
    path = write_annotations(tmp_path / "captions.json")
    assert prompts(path, "longest") == [("13", "a black cats"), ("21", "two dogs run"), ("32", "a very long caption here")]
    meta = coco2017_prompts(path, caption_rule="longest")[0].meta
    assert meta == {"image_id": 1, "file_name": "000000000001.jpg"}


def test_sjd_rule_never_resets_its_running_maximum(tmp_path: Path) -> None:
    path = write_annotations(tmp_path / "captions.json")
    # image 1: the maximum becomes 13 at index 1 ("a black cat  ", raw length); image 2: no caption beats 13,
    # so index 1 is carried over ("dog", not its longest); image 3: 24 > 13 at index 1
    assert prompts(path, "sjd") == [("12", "a black cat  "), ("22", "dog"), ("32", "a very long caption here")]
    assert prompts(path, "sjd", n=2) == [("12", "a black cat  "), ("22", "dog")]


def test_sjd_rule_says_when_its_carried_index_runs_past_an_image(tmp_path: Path) -> None:
    anns = [{"id": 1, "image_id": 1, "caption": "a"}, {"id": 2, "image_id": 1, "caption": "a cat"},
            {"id": 3, "image_id": 2, "caption": "dog"}]  # index 1 carried to an image with one caption
    path = write_annotations(tmp_path / "captions.json", anns)
    with pytest.raises(DatasetFileError, match="image 2 has 1 captions but SJD's loader picks caption #1"):
        coco2017_prompts(path, caption_rule="sjd")


def test_lantern_rule_follows_the_file_order(tmp_path: Path) -> None:
    path = write_annotations(tmp_path / "captions.json")
    # images by their first caption in the file (3, 1, 2); the longest raw caption, the first on ties
    assert prompts(path, "lantern") == [("32", "a very long caption here"), ("12", "a black cat  "), ("21", "two dogs run")]


def test_caption_rule_names_agree_and_are_checked(tmp_path: Path) -> None:
    assert set(CAPTION_RULES) == set(COCO_RULES)
    with pytest.raises(ConfigError, match="dataset.caption_rule='first' must be one of"):
        coco2017_prompts(write_annotations(tmp_path / "c.json"), caption_rule="first")
    with pytest.raises(ConfigError, match="dataset.caption_rule='first' must be one of"):
        validate(make_cfg("dataset=coco2017", "dataset.caption_rule=first"))


@pytest.mark.parametrize(("preset", "rule"), [("sjd_protocol", "sjd"), ("lantern_protocol", "lantern")])
def test_a_protocol_needs_its_prompts_when_generating(preset: str, rule: str) -> None:
    with pytest.raises(ConfigError, match=f"set dataset.caption_rule={rule}, or eval.caption_rule=null"):
        validate(make_cfg(f"eval={preset}", "dataset=coco2017"))
    validate(make_cfg(f"eval={preset}", "dataset=coco2017", f"dataset.caption_rule={rule}"))
    validate(make_cfg(f"eval={preset}", "dataset=coco2017", "eval.caption_rule=null"))
    validate(make_cfg(f"eval={preset}", "dataset=coco2017", "stage=evaluate"))  # the run's own rule is checked then
    validate(make_cfg(f"eval={preset}", "dataset=toy"))


# ---- presets end to end --------------------------------------------------------------------------


class ShapeSpy(nn.Module):
    """FID features (channel means and std) that remember the image sizes they were given."""

    num_features = 4

    def __init__(self) -> None:
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.uint8
        self.shapes.add(tuple(x.shape[1:]))
        x = x.float() / 255
        return torch.cat([x.mean(dim=(2, 3)), x.flatten(1).std(dim=1, keepdim=True)], dim=1)


def generated_image(i: int) -> np.ndarray:
    """24 x 40 (non-square), a different ramp per image."""
    r, c = np.mgrid[0:24, 0:40]
    return np.stack([(5 * r + 3 * c + 20 * i) % 256, (7 * c) % 256, np.full_like(r, 60 * i)], axis=2).astype(np.uint8)


@pytest.fixture
def coco_run(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    """A 3-image COCO-like run (config.yaml with the coco loader) and 4 raw reference images of other sizes."""
    images = [generated_image(i) for i in range(3)]
    metas = [{"image_id": i, "file_name": f"{i:012d}.png"} for i in range(3)]
    run = make_run(tmp_path / "run", method="ar", model="janus_pro_tiny", dataset="coco2017", n_images=3,
                   metas=metas, images=images)
    ref = tmp_path / "val2017"
    ref.mkdir()
    for i, (w, h) in enumerate([(30, 20), (20, 30), (25, 25), (40, 22)]):
        Image.fromarray(ramp(h, w)).save(ref / f"{i:012d}.png")
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.dataset = {"name": "coco2017", "_target_": "csd.data.coco.coco2017_prompts", "caption_rule": "sjd",
                   "fid_reference": str(ref)}
    OmegaConf.save(cfg, run / "config.yaml")
    return run, images


def preset_cfg(tmp_path: Path, preset: str) -> object:
    """The composed ``eval=<preset>`` with the tiny test CLIP (random weights in a local file)."""
    model_config = tiny_config(tmp_path)
    torch.manual_seed(0)
    weights = tmp_path / "tiny-clip.pt"
    torch.save(load_open_clip("tiny-test-clip", None, torch.device("cpu"), str(model_config)).model.state_dict(), weights)
    return make_cfg(f"eval={preset}", "logger=disabled", "device=cpu", "eval.metrics=[clip_score,fid]",
                    f"eval.fid.cache_dir={tmp_path / 'cache'}", f"eval.fid.weights_dir={tmp_path / 'no-fid-weights'}",
                    "eval.clip.model=tiny-test-clip",
                    f"eval.clip.pretrained={weights}", f"eval.clip.model_config={model_config}")


def expected_clip(tmp_path: Path, images: list[np.ndarray], prefix: str, scale: float,
                  resize: Callable[[Image.Image], Image.Image]) -> np.ndarray:
    """Per-image ``scale * cos`` with the tiny CLIP, images resized by ``resize`` (PIL -> PIL) first."""
    clip = load_open_clip("tiny-test-clip", str(tmp_path / "tiny-clip.pt"), torch.device("cpu"), str(tiny_config(tmp_path)))
    with torch.no_grad():
        pixels = torch.stack([clip.preprocess(resize(Image.fromarray(im))) for im in images])
        img = nn.functional.normalize(clip.model.encode_image(pixels), dim=-1)
        txt = nn.functional.normalize(clip.model.encode_text(clip.tokenizer([f"{prefix}caption {i}" for i in range(3)])), dim=-1)
    return scale * (img * txt).sum(-1).numpy()


def sjd_resize(image: Image.Image) -> Image.Image:
    """SJD's own call: ``interpolate`` on the uint8 tensor (torch's 8-bit kernel)."""
    x = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)[None]
    y = nn.functional.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
    return Image.fromarray(y[0].permute(1, 2, 0).numpy())


def lantern_resize(image: Image.Image) -> Image.Image:
    return TF.center_crop(image, min(image.size)).resize((256, 256), Image.LANCZOS)


@pytest.mark.parametrize("preset", ["sjd_protocol", "lantern_protocol", "janus_protocol", "default"])
def test_presets_settings_land_in_metrics_json(tmp_path: Path, coco_run, preset: str, monkeypatch, caplog) -> None:
    run, images = coco_run
    spy = ShapeSpy()
    monkeypatch.setattr("csd.evaluation.metrics.inception_fid", lambda feature, weights: module_fid(spy))
    cfg = preset_cfg(tmp_path, preset)
    with caplog.at_level(logging.WARNING, logger="csd.evaluation.metrics"):
        result = evaluate_run(run, cfg)
    # the protocols list the published package beside the imitation; without its weights file that column alone is
    # skipped, with the fetch line
    package = {"sjd_protocol": "fid_pytorch", "lantern_protocol": "fid_clean", "janus_protocol": "fid_clean"}.get(preset)
    assert set(result["skipped"]) == ({package} if package else set())
    assert all("wget" in why for why in result["skipped"].values())
    assert "fid" in result["metrics"]
    on_disk = json.loads((run / "metrics.json").read_text())["protocol"]
    clip, fid = on_disk["clip"], on_disk["fid"]
    assert clip["model"] == f"tiny-test-clip/{tmp_path / 'tiny-clip.pt'}"
    if preset == "sjd_protocol":
        assert on_disk["name"] == "sjd" and on_disk["caption_rule"] == "sjd" and on_disk["protocol_caption_rule"] == "sjd"
        assert clip == {**clip, "transforms": ["bilinear:299"], "prefix": "", "scale": 100, "clamp": "mean"}
        assert fid == {**fid, "transforms": ["bilinear:299"], "paired": False, "n_reference": 4}
        assert spy.shapes == {(3, 299, 299)}  # generated and reference images alike, whatever their size
        expected = max(float(expected_clip(tmp_path, images, "", 100, sjd_resize).mean()), 0.0)
        assert result["metrics"]["clip_score"] == pytest.approx(expected, abs=0.05)  # 8-bit kernel vs rounded floats
        assert "published on" not in caplog.text
    elif preset == "lantern_protocol":
        assert on_disk["name"] == "lantern" and on_disk["protocol_caption_rule"] == "lantern"
        assert clip == {**clip, "transforms": ["crop_long_edge", "lanczos:256"], "prefix": "A photo depicts ",
                        "scale": 1, "clamp": "none"}
        assert fid == {**fid, "transforms": ["crop_long_edge", "lanczos:256", "clean_bicubic:299"], "paired": False}
        assert spy.shapes == {(3, 299, 299)}
        expected = float(expected_clip(tmp_path, images, "A photo depicts ", 1, lantern_resize).mean())
        assert result["metrics"]["clip_score"] == pytest.approx(expected, abs=1e-5)
        assert "published on dataset.caption_rule=lantern prompts; this run used sjd" in caplog.text
    elif preset == "janus_protocol":  # GigaGAN's evaluation: LANTERN's steps (LANTERN's script is modified from it)
        assert on_disk["name"] == "janus" and on_disk["protocol_caption_rule"] is None
        assert clip == {**clip, "transforms": ["crop_long_edge", "lanczos:256"], "prefix": "A photo depicts ",
                        "scale": 1, "clamp": "none"}
        assert fid == {**fid, "transforms": ["crop_long_edge", "lanczos:256", "clean_bicubic:299"], "paired": False,
                       "n_reference": 4}
        assert spy.shapes == {(3, 299, 299)}
        expected = float(expected_clip(tmp_path, images, "A photo depicts ", 1, lantern_resize).mean())
        assert result["metrics"]["clip_score"] == pytest.approx(expected, abs=1e-5)
    else:
        assert on_disk["name"] == "default" and on_disk["protocol_caption_rule"] is None
        assert clip == {**clip, "transforms": [], "prefix": "", "scale": 100, "clamp": "image"}
        assert fid == {**fid, "transforms": [], "paired": True, "n_reference": 3}
        assert spy.shapes == {(3, 24, 40), (3, 20, 30), (3, 30, 20), (3, 25, 25)}  # raw: generated, 3 paired references
        expected = float(np.clip(expected_clip(tmp_path, images, "", 100, lambda im: im), 0, None).mean())
        assert result["metrics"]["clip_score"] == pytest.approx(expected, abs=1e-4)


def test_clamp_names_match_the_schema() -> None:
    from csd.keys import SCHEMA

    assert SCHEMA["eval.clip.clamp"].options == CLAMPS
