"""MS-COCO 2017 val captions as prompts (EVALUATION.md: longest caption per image, ascending image ids)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from pycocotools.coco import COCO

from csd.data.files import require_file
from csd.prompts import Prompt


def coco2017_prompts(annotations: str | Path, n_prompts: int | None = 5000, **_: object) -> list[Prompt]:
    """One prompt per val2017 image: its longest caption (the first one on ties).

    Images are taken in ascending id order; the prompt id is the caption's annotation id, and
    ``meta`` carries ``image_id`` and ``file_name`` so FID can pair generated and reference images.
    Extra dataset-config keys (``samples_per_prompt``, ``fid_reference``, ...) are ignored here.
    """
    path = require_file(annotations, "COCO captions file (captions_val2017.json)")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco = COCO(str(path))
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
    return prompts
