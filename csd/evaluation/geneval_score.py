"""GenEval scoring inside the harness (Ghosh et al. 2023, ``djghosh13/geneval``).

The decision rules of the official ``evaluation/evaluate_images.py`` and ``summary_scores.py``,
re-implemented as small functions over one image's detections: a detection is kept when its score
is ``> threshold`` (0.3; 0.9 on ``counting`` prompts), at most ``max_objects`` (16) per class, most
confident first, no NMS; ``include`` clauses are ANDed, ``exclude`` clauses ORed; colour and position
are judged on the ``count`` most confident detections; the overall score is the unweighted mean of
the task accuracies.

Backend: transformers' ``Mask2FormerForUniversalSegmentation`` (default
``facebook/mask2former-swin-small-coco-instance``), the same architecture as the official mmdet
Mask2Former Swin-S but another training run, so scores are close to, not equal to, published GenEval
numbers; every result names it (:data:`BACKEND_NOTE`). For the official numbers, score
:func:`csd.data.geneval.export_geneval` output with the official evaluator.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from csd.errors import MissingWeightsError
from csd.evaluation.clip_score import ClipModel, check_open_clip, load_open_clip
from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.images import load_rgb
from csd.hub import download_command, hub_reachable, load_local_first
from csd.progress import bar

DEFAULT_DETECTOR = "facebook/mask2former-swin-small-coco-instance"
BACKEND_NOTE = (
    "transformers Mask2FormerForUniversalSegmentation ({detector}); the official GenEval detector is the mmdet "
    "Mask2Former Swin-S COCO checkpoint: same architecture family, different training run, so scores are not "
    "identical to published GenEval numbers"
)
#: GenEval's ``object_names.txt``: COCO's 80 classes in COCO order, with GenEval's names for
#: mouse, remote and keyboard. Detector class ``i`` is name ``i``, as in the official evaluator.
GENEVAL_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
COLOUR_TEMPLATES = (
    "a photo of a {colour} {object}", "a photo of a {colour}-colored {object}", "a photo of a {colour} object",
)
GREY = (153, 153, 153)  # "#999": the background a masked object is pasted on before colour classification
TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
MAX_PER_IMAGE = 100  # mmdet Mask2Former test_cfg.max_per_image: top (query, class) pairs kept


@dataclass(frozen=True)
class Rules:
    """The official evaluator's ``--options`` with their defaults (the published protocol)."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    position_threshold: float = 0.1


@dataclass(frozen=True)
class Detections:
    """Detections in one image: ``boxes`` [N, 4] (x1, y1, x2, y2 px), ``scores`` [N], ``masks`` [N, H, W] bool,
    ``labels`` N class names."""

    boxes: np.ndarray
    scores: np.ndarray
    masks: np.ndarray
    labels: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, index: Sequence[int] | np.ndarray) -> Detections:
        index = np.asarray(index, dtype=np.int64)
        labels = tuple(self.labels[i] for i in index)
        return Detections(self.boxes[index], self.scores[index], self.masks[index], labels)


ColourFn = Callable[[Image.Image, Detections, str], list[str]]


def objects_by_class(dets: Detections, threshold: float, max_objects: int) -> dict[str, Detections]:
    """Per class: detections with score ``> threshold``, most confident first, at most ``max_objects`` (no NMS)."""
    out = {}
    for name in dict.fromkeys(dets.labels):
        idx = np.array([i for i, lab in enumerate(dets.labels) if lab == name], dtype=np.int64)
        idx = idx[np.argsort(-dets.scores[idx], kind="stable")]
        idx = idx[dets.scores[idx] > threshold][:max_objects]
        if len(idx):
            out[name] = dets.take(idx)
    return out


def relative_position(box_a: np.ndarray, box_b: np.ndarray, shrink: float = 0.1) -> set[str]:
    """Where box A lies relative to box B: ``left of`` / ``right of`` / ``above`` / ``below`` (any subset).

    The centre offset ``d = c_A - c_B`` is shrunk per axis by ``shrink * (size_A + size_B)`` (never past 0);
    a relation holds when the shrunk offset over ``|d|`` is beyond +-0.5 (strictly), e.g. ``dx < -0.5``:
    left of. Boxes overlapping that much along both axes have no relation.
    """
    boxes = np.stack([np.asarray(b, dtype=np.float64)[:4] for b in (box_a, box_b)]).reshape(2, 2, 2)  # [box, corner, xy]
    centre_a, centre_b = boxes.mean(axis=1)
    size_a, size_b = np.abs(boxes[:, 1] - boxes[:, 0])
    offset = centre_a - centre_b
    shrunk = np.maximum(np.abs(offset) - shrink * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


def _misplaced(boxes: np.ndarray, targets: np.ndarray, relation: str, shrink: float) -> set[str] | None:
    """The relations of the first (box, target) pair for which ``relation`` does not hold; None if it always does."""
    for box in boxes:
        for target in targets:
            if relation not in (rels := relative_position(box, target, shrink)):
                return rels
    return None


def judge(
    metadata: dict[str, Any], objects: dict[str, Detections], image: Image.Image, colour_of: ColourFn,
    shrink: float = 0.1,
) -> tuple[bool, str]:
    """Is the image correct for its GenEval metadata line? Returns ``(correct, reason)``.

    Each ``include`` clause needs ``count`` detections of its class; its ``color`` must be the colour of
    all ``count`` most confident ones; its ``position`` ``[relation, j]`` must hold between each of them and
    each object matched by include clause ``j`` (a failed clause ``j`` fails it). An ``exclude`` clause fails
    the image when ``count`` or more of its class are detected.
    """
    reasons: list[str] = []
    matched: list[Detections | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"], req["count"]
        found = objects[name].take(range(min(count, len(objects[name])))) if name in objects else None
        ok = found is not None and len(found) >= count
        if not ok:
            reasons.append(f"expected {name}>={count}, found {0 if found is None else len(found)}")
        if ok and "color" in req:
            colours = colour_of(image, found, name)
            if colours.count(req["color"]) < count:
                ok = False
                reasons.append(f"expected {req['color']} {name}>={count}, found colours {colours}")
        if ok and "position" in req:
            relation, target = req["position"]
            if matched[target] is None:
                ok = False
                reasons.append(f"no target for {name} to be {relation}")
            elif (wrong := _misplaced(found.boxes, matched[target].boxes, relation, shrink)) is not None:
                ok = False
                reasons.append(f"expected {name} {relation} target, found {' and '.join(sorted(wrong)) or 'no relation'}")
        matched.append(found if ok else None)
    for req in metadata.get("exclude", []):
        n = len(objects.get(req["class"], ()))
        if n >= req["count"]:
            reasons.append(f"expected {req['class']}<{req['count']}, found {n}")
    return not reasons, "; ".join(reasons)


def task_accuracies(tags: Sequence[str], correct: Sequence[bool]) -> dict[str, float]:
    """``geneval_<task>``: the fraction of correct images per task; ``geneval_overall``: their unweighted mean."""
    totals, hits = Counter(tags), Counter(t for t, c in zip(tags, correct, strict=True) if c)
    acc = {f"geneval_{t}": hits[t] / n for t, n in totals.items()}
    return {**acc, "geneval_overall": float(np.mean(list(acc.values())))} if acc else {}


# ------------------------------------------------------------------------------------------- models


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """Tight boxes ``[x1, y1, x2 + 1, y2 + 1]`` of ``[N, H, W]`` bool masks, zeros if empty (mmdet's mask2bbox)."""
    cols, rows = masks.any(1).float(), masks.any(2).float()  # [N, W], [N, H]
    boxes = torch.stack([cols.argmax(1), rows.argmax(1), masks.shape[2] - cols.flip(1).argmax(1),
                         masks.shape[1] - rows.flip(1).argmax(1)], dim=1).float()
    return torch.where(cols.any(1, keepdim=True), boxes, torch.zeros_like(boxes))


def instance_detections(
    class_logits: torch.Tensor, mask_logits: torch.Tensor, padded_hw: tuple[int, int], valid_hw: tuple[int, int],
    size_hw: tuple[int, int], class_names: Sequence[str],
) -> Detections:
    """Mask2Former instance post-processing as mmdet does it, for one image.

    ``class_logits`` [Q, C+1] (last = no object), ``mask_logits`` [Q, h, w] over the padded input. The top
    ``MAX_PER_IMAGE`` (query, class) softmax scores are kept; each mask is upsampled to the padded input
    (``padded_hw``), cropped to ``valid_hw`` (the resized image), resized to ``size_hw`` and binarised at logit 0; score =
    class probability x mean sigmoid inside the mask; box = the mask's tight box.
    """
    probs = class_logits.float().softmax(-1)[:, :-1]
    n_classes = probs.shape[1]
    scores, flat = probs.flatten().topk(min(MAX_PER_IMAGE, probs.numel()))
    labels, queries = flat % n_classes, flat // n_classes
    m = F.interpolate(mask_logits[queries][None].float(), size=padded_hw, mode="bilinear", align_corners=False)
    m = m[..., : valid_hw[0], : valid_hw[1]]
    m = F.interpolate(m, size=size_hw, mode="bilinear", align_corners=False)[0]
    binary = m > 0
    mask_score = (m.sigmoid() * binary).flatten(1).sum(1) / (binary.flatten(1).sum(1) + 1e-6)
    return Detections(
        mask_boxes(binary).cpu().numpy(), (scores * mask_score).cpu().numpy(), binary.cpu().numpy(),
        tuple(class_names[i] for i in labels.tolist()),
    )


class Mask2FormerDetector:
    """Image -> :class:`Detections` with a transformers Mask2Former instance-segmentation model."""

    def __init__(self, model: torch.nn.Module, processor: Any, device: torch.device, name: str) -> None:
        n = model.config.num_labels
        if n != len(GENEVAL_CLASSES):
            raise ValueError(f"eval.geneval.detector={name!r} has {n} classes; GenEval needs a COCO instance model (80)")
        self.model, self.processor, self.device, self.name = model.to(device).eval(), processor, device, name

    @torch.no_grad()
    def __call__(self, image: Image.Image) -> Detections:
        inputs = self.processor(images=[image], return_tensors="pt")
        pixel_mask = inputs["pixel_mask"][0].bool()
        out = self.model(**{k: inputs[k].to(self.device) for k in ("pixel_values", "pixel_mask")})
        valid = (int(pixel_mask.any(1).sum()), int(pixel_mask.any(0).sum()))
        return instance_detections(out.class_queries_logits[0], out.masks_queries_logits[0],
                                   tuple(pixel_mask.shape), valid, (image.height, image.width), GENEVAL_CLASSES)


def _detector_missing(path: str) -> MissingWeightsError:
    return MissingWeightsError(
        f"GenEval detector files not found at {path!r}. Download them with `{download_command(DEFAULT_DETECTOR)}` "
        "and set eval.geneval.detector=<dir> (or run without HF_HUB_OFFLINE on a machine that reaches the "
        "Hugging Face hub)."
    )


def _detector_source(path: str) -> str:
    """Where ``path`` (hub id or local directory) loads from; a path that names no directory raises."""
    if path.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(path)):
        raise _detector_missing(path)
    return os.path.expanduser(path)


def check_detector(path: str) -> None:
    """Raise the :class:`MissingWeightsError` :func:`load_detector` would for files that are not there, without
    loading the model: a directory that does not exist, or, when the hub is not reachable, a hub id that is not in
    the Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    source = _detector_source(path)
    if os.path.isdir(source) or hub_reachable():
        return  # a local directory, or a hub id the metric downloads
    if not isinstance(try_to_load_from_cache(source, "config.json"), str):
        raise _detector_missing(path)


def load_detector(path: str, device: torch.device) -> Mask2FormerDetector:
    """The Mask2Former model and its image processor from a hub id or a local directory."""
    from transformers import AutoImageProcessor, Mask2FormerForUniversalSegmentation

    source = _detector_source(path)

    def load() -> tuple[Any, Mask2FormerForUniversalSegmentation]:
        return (AutoImageProcessor.from_pretrained(source),
                Mask2FormerForUniversalSegmentation.from_pretrained(source))

    try:
        processor, model = load_local_first(load)
    except (OSError, ValueError) as err:  # hub clients raise OSError / HFValidationError subclasses
        raise _detector_missing(path) from err
    return Mask2FormerDetector(model, processor, device, path)


def crop_on_grey(image: Image.Image, box: np.ndarray, mask: np.ndarray) -> Image.Image:
    """The object's pixels (``mask``) on grey #999, cropped to its box: what the colour classifier sees."""
    pixels = np.where(mask[..., None], np.asarray(image.convert("RGB")), np.array(GREY, dtype=np.uint8))
    return Image.fromarray(pixels.astype(np.uint8)).crop(tuple(int(round(float(v))) for v in box[:4]))


class ColourClassifier:
    """Zero-shot CLIP colour of detected objects over :data:`COLOURS`.

    Each colour's text embedding is the normalised mean of the normalised embeddings of the 3
    :data:`COLOUR_TEMPLATES` for the object's class (clip_benchmark's ``zero_shot_classifier``); a crop
    gets the colour of highest cosine similarity. Runs in fp32 (the official evaluator uses autocast on CUDA).
    """

    def __init__(self, clip: ClipModel, device: torch.device) -> None:
        self.clip, self.device = clip, device
        self._text: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def text_embeddings(self, name: str) -> torch.Tensor:
        """``[D, len(COLOURS)]`` colour embeddings for objects of class ``name`` (cached)."""
        if name not in self._text:
            columns = []
            for colour in COLOURS:
                texts = [t.format(colour=colour, object=name) for t in COLOUR_TEMPLATES]
                emb = self.clip.model.encode_text(self.clip.tokenizer(texts).to(self.device)).float()
                emb = F.normalize(emb, dim=-1)
                columns.append(F.normalize(emb.mean(0), dim=-1))
            self._text[name] = torch.stack(columns, dim=1)
        return self._text[name]

    @torch.no_grad()
    def __call__(self, image: Image.Image, objects: Detections, name: str) -> list[str]:
        crops = [crop_on_grey(image, box, mask) for box, mask in zip(objects.boxes, objects.masks, strict=True)]
        pixels = torch.stack([self.clip.preprocess(c) for c in crops]).to(self.device)
        feats = F.normalize(self.clip.model.encode_image(pixels).float(), dim=-1)
        return [COLOURS[i] for i in (feats @ self.text_embeddings(name)).argmax(1).tolist()]


def _colour_clip_missing(model: str, pretrained: str) -> MissingWeightsError:
    return MissingWeightsError(
        f"GenEval colour CLIP {model}/{pretrained} is not available offline; run once with internet to fill the "
        "Hugging Face cache, or set eval.geneval.clip_pretrained=/path/to/open_clip_pytorch_model.bin."
    )


def load_colour_classifier(model: str, pretrained: str, device: torch.device) -> ColourClassifier:
    """open_clip ``model`` with ``pretrained`` (a tag such as ``openai`` or a local weights file)."""
    try:
        clip = load_open_clip(model, pretrained, device)
    except MissingWeightsError as err:
        raise _colour_clip_missing(model, pretrained) from err
    return ColourClassifier(clip, device)


def check_geneval_files(detector: str, clip_model: str, clip_pretrained: str) -> None:
    """The :class:`MissingWeightsError` the metric would raise for its detector or colour CLIP, without loading
    them."""
    check_detector(detector)
    try:
        check_open_clip(clip_model, clip_pretrained)
    except MissingWeightsError as err:
        raise _colour_clip_missing(clip_model, clip_pretrained) from err


# ------------------------------------------------------------------------------------------- metric


def score_image(
    image: Image.Image, metadata: dict[str, Any], detect: Callable[[Image.Image], Detections], colour_of: ColourFn,
    rules: Rules = Rules(),
) -> tuple[bool, str]:
    """Detect, keep the detections the rules keep (the counting threshold on ``counting`` prompts), judge."""
    threshold = rules.counting_threshold if metadata["tag"] == "counting" else rules.threshold
    objects = objects_by_class(detect(image), threshold, rules.max_objects)
    return judge(metadata, objects, image, colour_of, rules.position_threshold)


def geneval_metric(ctx: EvalContext) -> MetricOutput:
    """Per image ``geneval_correct`` (0/1), ``geneval_tag``, ``geneval_reason``; per task and overall accuracy."""
    metas = [r["meta"].get("geneval") for r in ctx.records]
    if any(m is None for m in metas):
        missing = sum(m is None for m in metas)
        raise NotApplicable(f"{missing} of {len(metas)} records have no GenEval metadata (generate with dataset=geneval)")
    g = ctx.eval.geneval
    rules = Rules(g.threshold, g.counting_threshold, g.max_objects, g.position_threshold)
    detector = load_detector(g.detector, ctx.device)
    colours = load_colour_classifier(g.clip_model, g.clip_pretrained, ctx.device)
    results = [score_image(load_rgb(image), meta, detector, colours, rules)
               for image, meta in bar(zip(ctx.images, metas, strict=True), total=len(metas), desc="GenEval", leave=False)]
    tags = [m["tag"] for m in metas]
    correct = [ok for ok, _ in results]
    protocol = {
        "geneval_backend": BACKEND_NOTE.format(detector=g.detector),
        "geneval": {
            "detector": g.detector, "detector_resize": dict(detector.processor.size),  # mmdet's: 800 / 1333
            "colour_clip": f"{g.clip_model}/{g.clip_pretrained}",
            "rules": asdict(rules), "images_per_task": dict(Counter(tags)),
            "tasks_missing": [t for t in TASKS if t not in tags],
        },
    }
    per_image = {"geneval_correct": [int(c) for c in correct], "geneval_tag": tags,
                 "geneval_reason": [reason for _, reason in results]}
    return MetricOutput(task_accuracies(tags, correct), per_image, protocol)
