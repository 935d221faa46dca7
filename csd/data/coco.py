"""MS-COCO 2017 val captions as prompts, one per image, chosen by a named rule (docs/EVALUATION.md, "Datasets")."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pycocotools.coco import COCO

from csd.data.files import read_json, require_file
from csd.errors import ConfigError, DatasetFileError
from csd.prompts import Prompt


def _check_entries(data: Any, key: str, path: Path, needs: tuple[tuple[str, type], ...]) -> None:
    """Raise :class:`DatasetFileError` naming the entry unless every ``data[key]`` entry has the ``needs`` (name, type) fields."""
    entries = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise DatasetFileError(f"{path}: no '{key}' list (is this a COCO captions file?)")
    singular = key.rstrip("s")
    for i, entry in enumerate(entries):
        for name, kind in needs:
            if not isinstance(entry, dict) or not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
                ident = entry.get("id") if isinstance(entry, dict) else None
                what = "an integer" if kind is int else "a string"
                raise DatasetFileError(f"{path}: {singular} #{i} (id={ident}): '{name}' missing or not {what}")


def _longest(coco: COCO, image_ids: list[int], _: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """Per image (ascending ids), its longest caption after stripping, the first on ties; stripped text."""
    for image_id in sorted(image_ids):
        anns = coco.imgToAnns[image_id]
        if anns:  # max() keeps the first maximal element: "first on ties"
            best = max(anns, key=lambda a: len(a["caption"].strip()))
            yield image_id, best, best["caption"].strip()


def _sjd(coco: COCO, image_ids: list[int], path: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """SJD's released loader (``MSCOCOPromptBench._init_coco_dataset_dict``), literally: images by ascending id,
    each image's captions in file order; the running maximum length and the index of the caption that set
    it are never reset, so an image whose captions are all shorter than the longest seen so far gets its
    caption at that carried-over index. Raw lengths and text (not stripped)."""
    max_len, max_index = 0, 0
    for image_id in sorted(image_ids):
        anns = coco.imgToAnns[image_id]
        if not anns:
            continue
        for i, ann in enumerate(anns):
            if max_len < len(ann["caption"]):
                max_len, max_index = len(ann["caption"]), i
        if max_index >= len(anns):
            raise DatasetFileError(
                f"{path}: image {image_id} has {len(anns)} captions but SJD's loader picks caption #{max_index} "
                "(its running index is not reset per image); this file cannot be read with dataset.caption_rule=sjd"
            )
        yield image_id, anns[max_index], anns[max_index]["caption"]


def _lantern(coco: COCO, image_ids: list[int], _: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """LANTERN's ``data/prompts/preprocess.py``: images in the order of their first caption in the file, the
    longest raw caption of each (a later one replaces it only if strictly longer); raw text."""
    first = {}
    for index, ann in enumerate(coco.dataset["annotations"]):
        first.setdefault(ann["image_id"], index)
    for image_id in sorted((i for i in image_ids if i in first), key=first.__getitem__):
        best = max(coco.imgToAnns[image_id], key=lambda a: len(a["caption"]))
        yield image_id, best, best["caption"]


#: ``dataset.caption_rule`` -> (image id, chosen annotation, prompt text) in prompt order
CAPTION_RULES: dict[str, Callable[[COCO, list[int], Path], Iterator[tuple[int, dict[str, Any], str]]]] = {
    "longest": _longest,
    "sjd": _sjd,
    "lantern": _lantern,
}


def coco2017_prompts(
    annotations: str | Path, n_prompts: int | None = 5000, caption_rule: str = "longest", **_: object
) -> list[Prompt]:
    """One prompt per val2017 image, its caption chosen by ``caption_rule`` (:data:`CAPTION_RULES`;
    docs/EVALUATION.md, "Datasets").

    The prompt id is the caption's annotation id, and ``meta`` carries ``image_id`` and ``file_name``
    so FID can pair generated and reference images. Extra dataset-config keys (``samples_per_prompt``,
    ``fid_reference``, ...) are ignored here.
    """
    if caption_rule not in CAPTION_RULES:
        raise ConfigError(f"dataset.caption_rule={caption_rule!r} must be one of {sorted(CAPTION_RULES)}")
    path = require_file(annotations, "COCO captions file (captions_val2017.json)", "dataset.annotations")
    data = read_json(path)
    _check_entries(data, "images", path, (("id", int),))
    _check_entries(data, "annotations", path, (("id", int), ("image_id", int), ("caption", str)))
    coco = COCO()  # the checked content, indexed by pycocotools (its own loader gives bare tracebacks)
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    prompts = []
    for image_id, ann, text in CAPTION_RULES[caption_rule](coco, coco.getImgIds(), path):
        info = coco.loadImgs([image_id])[0]
        meta = {"image_id": image_id, "file_name": info.get("file_name", f"{image_id:012d}.jpg")}
        prompts.append(Prompt(str(ann["id"]), text, meta))
        if n_prompts is not None and len(prompts) == n_prompts:
            break
    if not prompts:
        raise DatasetFileError(f"{path}: no prompts (no image has a caption annotation)")
    return prompts
