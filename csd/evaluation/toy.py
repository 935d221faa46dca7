"""Evaluators of the toy domain (``model=toy``), built on ``csd.toy``'s scene checker, segmenter and CLIP.

``csd.toy`` is imported lazily so the rest of the evaluation stage works without it. A toy prompt's
``meta`` is its scene spec (``SceneSpec.to_meta()``); ``scene_key`` selects a sub-key instead, and
the caption is used when the record has no spec.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from hydra.utils import get_method
from PIL import Image

from csd.errors import MissingWeightsError
from csd.evaluation.clip_score import ClipModel
from csd.evaluation.content import on_grid, region_grid
from csd.evaluation.images import load_rgb, to_tensor, uint8_batches
from csd.progress import bar
from csd.prompts import Prompt
from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED

REGIONS = ("object", "smooth", "textured")
#: token cells by their pixels in the generated image's segmentation: all object, some (the boundary), none
CELL_REGIONS = ("object", "edge", "background")


def _toy(module: str) -> Any:
    return importlib.import_module(f"csd.toy.{module}")


def scene_of(record: dict[str, Any], scene_key: str | None) -> Any:
    meta = record["meta"] if scene_key is None else record["meta"].get(scene_key)
    return meta or record["prompt"]


def load_toy_clip_model(device: torch.device) -> ClipModel:
    """The toy's open_clip-compatible CLIP (``csd.toy.clip.load_toy_clip``)."""
    try:
        model, preprocess, tokenizer = _toy("clip").load_toy_clip(device)
    except FileNotFoundError as err:
        raise MissingWeightsError(str(err)) from err
    model.eval()
    return ClipModel(model, preprocess, tokenizer, "toy-clip")


def scene_checks(records: Sequence[dict[str, Any]], images: Sequence[Image.Image], scene_key: str | None
                 ) -> list[dict[str, bool]]:
    """``csd.toy.checker.check_image`` of every generated image (``images[i]``: ``records[i]``'s) against its prompt's
    scene."""
    checker = _toy("checker")
    return [
        checker.check_image(np.asarray(load_rgb(image)), scene_of(r, scene_key))
        for r, image in bar(zip(records, images, strict=True), total=len(records), desc="scene checker", unit="img",
                             leave=False)
    ]


def scene_correct(
    checks: Sequence[dict[str, Any]], categories: Sequence[str], only_if: dict[str, str]
) -> dict[str, list[bool | None]]:
    """Per image and category (``scene_<category>``): whether the check passed; None where the category does
    not count for the image. ``only_if`` restricts a category to the images whose check has that flag set
    (``position`` is vacuously true for prompts without a relation, so it counts for ``relation_asked`` ones)."""
    out = {}
    for cat in categories:
        flag = only_if.get(cat)
        out[f"scene_{cat}"] = [bool(c[cat]) if cat in c and (flag is None or c.get(flag, True)) else None for c in checks]
    return out


def scene_accuracy(
    checks: Sequence[dict[str, Any]], categories: Sequence[str], only_if: dict[str, str]
) -> dict[str, float]:
    """GenEval-style accuracy per category (``scene_acc_<category>``): the mean of :func:`scene_correct` over
    the images the category counts for."""
    out = {}
    for column, values in scene_correct(checks, categories, only_if).items():
        vals = [v for v in values if v is not None]
        if vals:
            out[f"scene_acc_{column.removeprefix('scene_')}"] = float(np.mean(vals))
    return out


def rendered_reference(
    records: Sequence[dict[str, Any]], render: str, batch_size: int
) -> tuple[dict[str, Any], Callable[[], Iterator[torch.Tensor]]]:
    """Real toy scenes for the run's prompts, one per record, by the dotted function ``render(Prompt)``.

    ``render`` returns a uint8 ``[H, W, 3]`` image or a tuple starting with one (the toy's
    ``heldout_scene`` gives ``(image, layout)``). Returns the reference's cache-key description (the
    renderer's name, the prompts and a sha256 of the rendered scenes, so a changed scene law under the
    same name misses the cache) and a batch factory (called on a cache miss).
    """
    prompts = [Prompt(r["prompt_id"], r["prompt"], r["meta"]) for r in records]
    render_fn = get_method(render)

    def image(prompt: Prompt) -> np.ndarray:
        out = render_fn(prompt)
        return np.ascontiguousarray(np.asarray(out[0] if isinstance(out, tuple) else out, dtype=np.uint8))

    images = [image(p) for p in prompts]  # toy scenes are small and cheap: rendered once, digested and batched
    digest = hashlib.sha256()
    for im in images:
        digest.update(f"{im.shape}".encode())
        digest.update(im.tobytes())

    def batches() -> Iterator[torch.Tensor]:
        return uint8_batches((to_tensor(im) for im in images), batch_size)

    return {"render": render, "prompts": [(p.prompt_id, p.text, p.meta) for p in prompts],
            "scenes_sha256": digest.hexdigest()}, batches


def region_acceptance(records: Sequence[dict[str, Any]], images: Sequence[Image.Image], scene_key: str | None
                      ) -> dict[str, dict[str, float]]:
    """Accepted and relaxed drafts per region: object cells vs smooth vs textured background (``images[i]``:
    ``records[i]``'s image).

    Each generated image is segmented (``csd.toy.checker.segment``, label 0 = background), the label
    map is downsampled to the token grid, and background cells take the scene's
    ``background_kind`` ('smooth' | 'textured').
    """
    checker = _toy("checker")
    counts = {reg: {"positions": 0, "accepted": 0, "relaxed": 0} for reg in REGIONS}
    pairs = zip(records, images, strict=True)
    for r, image in bar(pairs, total=len(records), desc="regions", unit="img", leave=False):
        kinds = on_grid(r, "commit_kind")
        obj = region_grid(np.asarray(checker.segment(np.asarray(load_rgb(image)))), r["grid"])
        background = checker.background_kind(scene_of(r, scene_key))
        for reg, mask in (("object", obj), (background, ~obj)):
            k = kinds[mask]
            counts[reg]["positions"] += int(k.size)
            counts[reg]["accepted"] += int(np.isin(k, (COMMIT_ACCEPTED, COMMIT_RELAXED)).sum())
            counts[reg]["relaxed"] += int((k == COMMIT_RELAXED).sum())
    for c in counts.values():
        n = c["positions"]
        c["accepted_rate"] = c["accepted"] / n if n else float("nan")
        c["relaxed_rate"] = c["relaxed"] / n if n else float("nan")
    return counts


def cell_regions(labels: np.ndarray, grid: Sequence[int]) -> np.ndarray:
    """``[rows, cols]`` index into :data:`CELL_REGIONS` per token cell of a pixel label map (0 = background):
    0 when every pixel of the cell is an object's, 1 when some are, 2 when none is."""
    rows, cols = grid
    h, w = labels.shape
    share = (labels != 0).reshape(rows, h // rows, cols, w // cols).mean(axis=(1, 3))
    return np.where(share == 1.0, 0, np.where(share > 0.0, 1, 2))


def entropy_by_region(records: Sequence[dict[str, Any]], images: Sequence[Image.Image]) -> dict[str, Any]:
    """Target entropy (nats, the record's ``entropy``: the processed target distribution of each committed position)
    per cell region (:data:`CELL_REGIONS`, from ``csd.toy.checker.segment`` of the generated image).

    Returns ``per_image``: ``{"body": [...], region: [...]}`` per-image means (NaN where an image has no cell of the
    region) and ``share``: ``{region: [...]}`` per-image fractions of the cells, in record order; and ``values``:
    ``{region: array}`` of every position's entropy, pooled over images.
    """
    checker = _toy("checker")
    per_image: dict[str, list[float]] = {"body": [], **{r: [] for r in CELL_REGIONS}}
    share: dict[str, list[float]] = {r: [] for r in CELL_REGIONS}
    pooled: dict[str, list[np.ndarray]] = {r: [] for r in CELL_REGIONS}
    for r, image in zip(records, images, strict=True):
        entropy = on_grid(r, "entropy").astype(float)
        regions = cell_regions(np.asarray(checker.segment(np.asarray(load_rgb(image)))), r["grid"])
        per_image["body"].append(float(entropy.mean()))
        for k, name in enumerate(CELL_REGIONS):
            values = entropy[regions == k]
            per_image[name].append(float(values.mean()) if values.size else float("nan"))
            share[name].append(values.size / entropy.size)
            pooled[name].append(values)
    return {"per_image": per_image, "share": share, "values": {k: np.concatenate(v) for k, v in pooled.items()}}
