"""MS-COCO 2017 val captions as prompts (docs/EVALUATION.md: longest caption per image, ascending image ids)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

from pycocotools.coco import COCO

from csd.data.files import DatasetFileError, read_json, require_file
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


def coco2017_prompts(annotations: str | Path, n_prompts: int | None = 5000, **_: object) -> list[Prompt]:
    """One prompt per val2017 image: its longest caption (the first one on ties).

    Images are taken in ascending id order; the prompt id is the caption's annotation id, and
    ``meta`` carries ``image_id`` and ``file_name`` so FID can pair generated and reference images.
    Extra dataset-config keys (``samples_per_prompt``, ``fid_reference``, ...) are ignored here.
    """
    path = require_file(annotations, "COCO captions file (captions_val2017.json)")
    data = read_json(path)
    _check_entries(data, "images", path, (("id", int),))
    _check_entries(data, "annotations", path, (("id", int), ("image_id", int), ("caption", str)))
    coco = COCO()  # the checked content, indexed by pycocotools (its own loader gives bare tracebacks)
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    prompts = []
    for image_id in sorted(coco.getImgIds()):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        if not anns:
            continue
        # max() keeps the first maximal element, which is the "first on ties" rule
        best = max(anns, key=lambda a: len(a["caption"].strip()))
        info = coco.loadImgs([image_id])[0]
        meta = {"image_id": image_id, "file_name": info.get("file_name", f"{image_id:012d}.jpg")}
        prompts.append(Prompt(str(best["id"]), best["caption"].strip(), meta))
        if n_prompts is not None and len(prompts) == n_prompts:
            break
    if not prompts:
        raise DatasetFileError(f"{path}: no prompts (no image has a caption annotation)")
    return prompts
