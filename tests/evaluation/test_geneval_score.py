"""GenEval scoring: the official decision rules on constructed detections, and the metric end to end
with a tiny random Mask2Former and the toy CLIP (wiring, not accuracy)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluate import evaluate_run
from csd.evaluation import METRICS_FILE
from csd.evaluation.clip_score import ClipModel
from csd.evaluation.context import EvalContext, NotApplicable
from csd.evaluation.geneval_score import (
    COLOURS,
    GENEVAL_CLASSES,
    MAX_PER_IMAGE,
    ColourClassifier,
    Detections,
    crop_on_grey,
    instance_detections,
    judge,
    load_colour_classifier,
    load_detector,
    objects_by_class,
    relative_position,
    score_image,
    task_accuracies,
)
from csd.registry import metric
from tests.evaluation.test_eval_fixtures import eval_cfg, make_run, solid_image

SIZE = 64
IMAGE = Image.new("RGB", (SIZE, SIZE))


def dets(*objs: tuple[str, tuple[float, float, float, float], float]) -> Detections:
    """Detections from (class, box, score); each mask fills its box."""
    masks = np.zeros((len(objs), SIZE, SIZE), dtype=bool)
    for m, (_, box, _) in zip(masks, objs, strict=True):
        x1, y1, x2, y2 = (int(v) for v in box)
        m[y1:y2, x1:x2] = True
    boxes = np.array([b for _, b, _ in objs], dtype=np.float64).reshape(-1, 4)
    return Detections(boxes, np.array([s for *_, s in objs], dtype=np.float64), masks, tuple(c for c, *_ in objs))


def colour_by_left_edge(colours: dict[float, str], calls: list[int] | None = None):
    """A colour classifier that reads each object's colour off its box's x1 (and logs how many it was given)."""

    def colour_of(image: Image.Image, objects: Detections, name: str) -> list[str]:
        if calls is not None:
            calls.append(len(objects))
        return [colours[float(b[0])] for b in objects.boxes]

    return colour_of


def verdict(meta: dict, *objs, colours: dict[float, str] | None = None) -> bool:
    objects = objects_by_class(dets(*objs), 0.3, 16)
    return judge(meta, objects, IMAGE, colour_by_left_edge(colours or {}))[0]


# ------------------------------------------------------------------------------------------ position

A = (-1.0, 0.0, 1.0, 0.0)  # centre (0, 0), width 2, height 0


@pytest.mark.parametrize(("box_a", "box_b", "expected"), [
    ((0, 0, 10, 10), (30, 0, 40, 10), {"left of"}),
    ((30, 0, 40, 10), (0, 0, 10, 10), {"right of"}),
    ((0, 0, 10, 10), (0, 30, 10, 40), {"above"}),
    ((0, 30, 10, 40), (0, 0, 10, 10), {"below"}),
    ((0, 0, 10, 10), (30, 30, 40, 40), {"left of", "above"}),
    ((0, 0, 10, 10), (1, 1, 11, 11), set()),   # overlapping: the 0.1 shrink removes the whole offset
    # offset (-3, 4), x sizes 2 + 3: dx = -(3 - 0.1 * 5) / 5 = -0.5 exactly, not left of; dy = 0.8: below
    (A, (1.5, -4.0, 4.5, -4.0), {"below"}),
    (A, (1.55, -4.0, 4.45, -4.0), {"below", "left of"}),   # x sizes 2 + 2.9: dx = -0.502
    ((1.5, -4.0, 4.5, -4.0), A, {"above"}),                 # dx = +0.5 exactly: not right of
    # the same on the vertical axis: dy = -0.5 exactly is not above
    ((0.0, -1.0, 0.0, 1.0), (-4.0, 1.5, -4.0, 4.5), {"right of"}),
    ((-4.0, 1.5, -4.0, 4.5), (0.0, -1.0, 0.0, 1.0), {"left of"}),
])
def test_relative_position(box_a, box_b, expected) -> None:
    assert relative_position(np.array(box_a), np.array(box_b)) == expected


# ------------------------------------------------------------------------------------------ detections


def test_objects_by_class_threshold_order_and_cap() -> None:
    d = dets(("cat", (0, 0, 4, 4), 0.3), ("cat", (5, 0, 9, 4), 0.31), ("cat", (10, 0, 14, 4), 0.9),
             ("dog", (0, 5, 4, 9), 0.2), *[("cup", (i, 20, i + 2, 22), 0.5 + i / 1000) for i in range(20)])
    objects = objects_by_class(d, 0.3, 16)
    assert set(objects) == {"cat", "cup"}                       # dog below the threshold
    assert objects["cat"].scores.tolist() == [0.9, 0.31]        # score == threshold is dropped; sorted
    assert len(objects["cup"]) == 16 and objects["cup"].scores[0] == pytest.approx(0.519)
    assert len(objects_by_class(d, 0.9, 16).get("cat", ())) == 0   # strictly greater than 0.9


def test_counting_threshold_applies_to_counting_prompts_only() -> None:
    d = dets(("clock", (0, 0, 8, 8), 0.95), ("clock", (20, 0, 28, 8), 0.92), ("clock", (40, 0, 48, 8), 0.5))
    two = {"tag": "counting", "include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}]}
    ok, _ = score_image(IMAGE, two, lambda _: d, colour_by_left_edge({}))
    assert ok                                                   # the 0.5 clock is below 0.9
    three = {"tag": "two_object", "include": [{"class": "clock", "count": 3}]}
    assert score_image(IMAGE, three, lambda _: d, colour_by_left_edge({}))[0]   # 0.3 elsewhere: three clocks
    three["tag"] = "counting"
    assert not score_image(IMAGE, three, lambda _: d, colour_by_left_edge({}))[0]


# ------------------------------------------------------------------------------------------ tasks

BENCH = {"tag": "single_object", "include": [{"class": "bench", "count": 1}]}
TWO = {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "tv remote", "count": 1}]}
COUNT = {"tag": "counting", "include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}]}
PINK = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "pink"}]}
ATTR = {"tag": "color_attr", "include": [{"class": "wine glass", "count": 1, "color": "purple"},
                                         {"class": "apple", "count": 1, "color": "black"}]}
RIGHT = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                        {"class": "dog", "count": 1, "position": ["right of", 0]}]}


def test_single_and_two_object() -> None:
    assert verdict(BENCH, ("bench", (0, 0, 9, 9), 0.8))
    assert not verdict(BENCH, ("chair", (0, 0, 9, 9), 0.8))
    assert not verdict(BENCH, ("bench", (0, 0, 9, 9), 0.2))
    assert verdict(TWO, ("cat", (0, 0, 9, 9), 0.8), ("tv remote", (20, 0, 29, 9), 0.6))
    assert not verdict(TWO, ("cat", (0, 0, 9, 9), 0.8), ("cat", (20, 0, 29, 9), 0.6))   # includes are ANDed


def test_counting() -> None:
    clock = [("clock", (10 * i, 0, 10 * i + 8, 8), 0.5) for i in range(4)]
    assert verdict(COUNT, *clock[:2])
    assert not verdict(COUNT, *clock[:1])
    assert not verdict(COUNT, *clock[:3])      # the exclude clause: 3 or more clocks fail


def test_excludes_are_ored() -> None:
    meta = {"tag": "single_object", "include": [{"class": "cat", "count": 1}],
            "exclude": [{"class": "dog", "count": 1}, {"class": "cat", "count": 2}]}
    cat = ("cat", (0, 0, 8, 8), 0.9)
    assert verdict(meta, cat)
    assert not verdict(meta, cat, ("dog", (20, 0, 28, 8), 0.9))
    assert not verdict(meta, cat, ("cat", (20, 0, 28, 8), 0.9))


def test_colours() -> None:
    car = ("car", (0, 0, 8, 8), 0.9)
    assert verdict(PINK, car, colours={0.0: "pink"})
    assert not verdict(PINK, car, colours={0.0: "red"})
    glass, apple = ("wine glass", (0, 0, 8, 8), 0.9), ("apple", (20, 0, 28, 8), 0.9)
    assert verdict(ATTR, glass, apple, colours={0.0: "purple", 20.0: "black"})
    assert not verdict(ATTR, glass, apple, colours={0.0: "purple", 20.0: "red"})


def test_colour_is_judged_on_the_most_confident_count_objects() -> None:
    calls: list[int] = []
    objects = objects_by_class(dets(("car", (0, 0, 8, 8), 0.9), ("car", (20, 0, 28, 8), 0.5)), 0.3, 16)
    ok, _ = judge(PINK, objects, IMAGE, colour_by_left_edge({0.0: "pink", 20.0: "red"}, calls))
    assert ok and calls == [1]
    objects = objects_by_class(dets(("car", (0, 0, 8, 8), 0.5), ("car", (20, 0, 28, 8), 0.9)), 0.3, 16)
    assert not judge(PINK, objects, IMAGE, colour_by_left_edge({0.0: "pink", 20.0: "red"}))[0]


def test_position() -> None:
    bear, dog_right, dog_left = ("teddy bear", (0, 0, 8, 8), 0.9), ("dog", (40, 0, 48, 8), 0.8), ("dog", (0, 40, 8, 48), 0.7)
    assert verdict(RIGHT, bear, dog_right)
    assert not verdict(RIGHT, bear, ("dog", (0, 40, 8, 48), 0.8))          # below, not right of
    assert not verdict(RIGHT, dog_right)                                  # no target
    assert not verdict(RIGHT, bear)                                       # no dog
    assert verdict(RIGHT, bear, dog_right, dog_left)                      # only the most confident dog counts
    assert not verdict(RIGHT, bear, ("dog", (40, 0, 48, 8), 0.6), dog_left)


def test_task_accuracies_are_an_unweighted_mean_over_tasks() -> None:
    acc = task_accuracies(["counting"] * 3 + ["position"], [True, True, True, False])
    assert acc == {"geneval_counting": 1.0, "geneval_position": 0.0, "geneval_overall": 0.5}


# ------------------------------------------------------------------------------------------ models


def test_instance_detections_scores_boxes_and_padding() -> None:
    n_classes = len(GENEVAL_CLASSES)
    logits = torch.full((2, n_classes + 1), -20.0)
    logits[0, GENEVAL_CLASSES.index("cat")] = 20.0        # query 0: surely a cat
    logits[1, GENEVAL_CLASSES.index("dog")] = 20.0        # query 1: surely a dog, but ...
    masks = torch.full((2, 8, 8), -10.0)
    masks[0, 1:3, 2:6] = 10.0                             # inside the image (top 4 rows of the padded input)
    masks[1, 5:7, :] = 10.0                               # ... its mask is in the padding only
    d = instance_detections(logits, masks, (8, 8), (4, 8), (4, 8), GENEVAL_CLASSES)
    assert len(d) == MAX_PER_IMAGE and d.masks.shape[1:] == (4, 8)
    cat, dog = d.labels.index("cat"), d.labels.index("dog")
    assert d.scores[cat] == pytest.approx(1.0, abs=1e-3) and d.masks[cat].sum() == 8
    assert d.boxes[cat].tolist() == [2.0, 1.0, 6.0, 3.0]                  # x2, y2 one past the last pixel
    assert d.scores[dog] == 0.0 and d.boxes[dog].tolist() == [0.0] * 4   # nothing left after the crop


def test_crop_on_grey() -> None:
    image = Image.fromarray(np.full((16, 16, 3), 200, dtype=np.uint8))
    mask = np.zeros((16, 16), dtype=bool)
    mask[2:4, 2:6] = True
    crop = np.asarray(crop_on_grey(image, np.array([2.0, 2.0, 8.0, 6.0]), mask))
    assert crop.shape == (4, 6, 3)
    assert (crop[:2, :4] == 200).all() and (crop[2:] == 153).all() and (crop[:, 4:] == 153).all()


PALETTE = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


class ColourClip(nn.Module):
    """Image embedding = centred mean colour; text embedding = the colour word of the prompt, centred."""

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) - 0.5

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        table = torch.tensor([PALETTE.get(c, (128, 128, 128)) for c in COLOURS], dtype=torch.float32) / 255 - 0.5
        return table[ids]


def test_colour_classifier_uses_the_masked_crop() -> None:
    clip = ClipModel(
        ColourClip(),
        lambda im: torch.from_numpy(np.asarray(im.resize((4, 4)), dtype=np.float32) / 255).permute(2, 0, 1),
        lambda texts: torch.tensor([COLOURS.index(t.split()[4].split("-")[0]) for t in texts]),
        "colour",
    )
    pixels = np.zeros((16, 32, 3), dtype=np.uint8)
    pixels[:, :16] = PALETTE["blue"]
    pixels[:, 16:] = PALETTE["red"]
    d = dets(("car", (0, 0, 16, 16), 0.9), ("car", (16, 0, 32, 16), 0.8))
    d = Detections(d.boxes, d.scores, d.masks[:, :16, :32], d.labels)
    assert ColourClassifier(clip, torch.device("cpu"))(Image.fromarray(pixels), d, "car") == ["blue", "red"]


def test_missing_detector_weights_are_actionable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingWeightsError, match="eval.geneval.detector=<dir>"):
        load_detector("/nowhere/mask2former", torch.device("cpu"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MissingWeightsError, match="hf download facebook/mask2former-swin-small-coco-instance --local-dir"):
        load_detector("nobody-here/no-such-mask2former", torch.device("cpu"))


# ------------------------------------------------------------------------------------------ end to end

LINES = [
    {"tag": "single_object", "include": [{"class": "apple", "count": 1}], "prompt": "a photo of an apple"},
    {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"},
    {"tag": "colors", "include": [{"class": "apple", "count": 1, "color": "red"}], "prompt": "a photo of a red apple"},
]


def tiny_mask2former(path: Path) -> None:
    """A random Mask2Former (tiny Swin) whose classifier always says "apple", saved with its processor."""
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessor,
        SwinConfig,
    )

    swin = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
                      window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(
        backbone_config=swin, use_pretrained_backbone=False, hidden_dim=32, mask_feature_size=32, feature_size=32,
        encoder_layers=1, decoder_layers=2, num_attention_heads=2, dim_feedforward=32, encoder_feedforward_dim=32,
        num_queries=8, id2label=dict(enumerate(GENEVAL_CLASSES)), label2id={c: i for i, c in enumerate(GENEVAL_CLASSES)},
    )
    torch.manual_seed(0)
    model = Mask2FormerForUniversalSegmentation(config).eval()
    with torch.no_grad():
        model.class_predictor.bias[GENEVAL_CLASSES.index("apple")] = 50.0
    model.save_pretrained(path)
    Mask2FormerImageProcessor(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(path)


def test_geneval_metric_end_to_end(tmp_path: Path) -> None:
    from csd.toy.clip import CLIP_NAME, WEIGHTS_FILE, register_toy_clip

    register_toy_clip()
    tiny_mask2former(tmp_path / "det")
    metas = [{"index": i, "geneval": line} for i, line in enumerate(LINES)]
    run = make_run(tmp_path / "run", model="janus_pro_tiny", dataset="geneval", n_images=3, metas=metas,
                   images=[solid_image(40 * i + 60, size=48, noise=30, seed=i) for i in range(3)])
    cfg = eval_cfg(tmp_path, **{"eval.metrics": ["geneval"], "eval.strict": True,
                                "eval.geneval.detector": str(tmp_path / "det"),
                                "eval.geneval.clip_model": CLIP_NAME, "eval.geneval.clip_pretrained": str(WEIGHTS_FILE)})
    result = evaluate_run(run, cfg)
    assert result == json.loads((run / METRICS_FILE).read_text())
    m = result["metrics"]
    assert m["geneval_single_object"] == 0.5                     # the apple is found, the dog is not
    assert m["geneval_colors"] in (0.0, 1.0)
    assert m["geneval_overall"] == pytest.approx((m["geneval_single_object"] + m["geneval_colors"]) / 2)
    backend = result["protocol"]["geneval_backend"]
    assert str(tmp_path / "det") in backend and "mmdet" in backend
    assert result["protocol"]["geneval"]["tasks_missing"] == ["two_object", "counting", "position", "color_attr"]
    assert result["protocol"]["geneval"]["detector_resize"] == {"shortest_edge": 64, "longest_edge": 96}
    per_image = metric("geneval")(EvalContext.load(run, cfg.eval, "cpu")).per_image
    assert per_image["geneval_tag"] == ["single_object", "single_object", "colors"]
    assert per_image["geneval_correct"][:2] == [1, 0] and "found 0" in per_image["geneval_reason"][1]
    assert per_image["geneval_correct"][2] == 1 or "found colours" in per_image["geneval_reason"][2]   # CLIP ran


def test_geneval_is_not_applicable_without_metadata(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", model="janus_pro_tiny", dataset="coco2017", n_images=2)
    ctx = EvalContext.load(run, eval_cfg(tmp_path).eval, "cpu")
    with pytest.raises(NotApplicable, match="2 of 2 records have no GenEval metadata"):
        metric("geneval")(ctx)


def test_missing_weights_skip_the_metric_with_the_fix(tmp_path: Path) -> None:
    metas = [{"index": 0, "geneval": LINES[0]}]
    run = make_run(tmp_path / "run", model="janus_pro_tiny", dataset="geneval", n_images=1, metas=metas)
    cfg = eval_cfg(tmp_path, **{"eval.metrics": ["geneval"], "eval.geneval.detector": str(tmp_path / "none")})
    assert "eval.geneval.detector=<dir>" in evaluate_run(run, cfg)["skipped"]["geneval"]
    with pytest.raises(MissingWeightsError, match="eval.geneval.clip_pretrained="):
        load_colour_classifier("ViT-L-14", str(tmp_path / "no_clip.bin"), torch.device("cpu"))
