"""MS-COCO 2014 val captions, Janus' protocol (Chen et al. 2025, Janus-Pro, arXiv 2501.17811; the LlamaGen /
Janus MSCOCO-30k FID setting): 30,000 val2014 images drawn at random (seeded), one random caption of each."""

from __future__ import annotations

import random
from pathlib import Path

from csd.data.coco import _check_entries
from csd.data.files import read_json, require_file
from csd.errors import DatasetFileError
from csd.prompts import Prompt

COCO2014_PROMPTS = 30000


def coco2014_prompts(annotations: str | Path, n_prompts: int | None = COCO2014_PROMPTS, sample_seed: int = 0,
                     **_: object) -> list[Prompt]:
    """``n_prompts`` distinct images drawn without replacement from the images with a caption (ascending ids
    shuffled by ``random.Random(sample_seed)``), and for each a caption drawn by the same generator; prompt id = the
    caption's annotation id, ``meta``: ``image_id``, ``file_name`` (FID pairing). Fewer images than ``n_prompts``:
    all of them."""
    path = require_file(annotations, "COCO 2014 captions file (captions_val2014.json)", "dataset.annotations")
    data = read_json(path)
    _check_entries(data, "images", path, (("id", int),))
    _check_entries(data, "annotations", path, (("id", int), ("image_id", int), ("caption", str)))
    captions: dict[int, list[dict]] = {}
    for ann in data["annotations"]:
        captions.setdefault(ann["image_id"], []).append(ann)
    files = {img["id"]: img.get("file_name", f"COCO_val2014_{img['id']:012d}.jpg") for img in data["images"]}
    ids = sorted(i for i in files if i in captions)
    if not ids:
        raise DatasetFileError(f"{path}: no prompts (no image has a caption annotation)")
    rng = random.Random(sample_seed)
    chosen = rng.sample(ids, min(len(ids), n_prompts or len(ids)))
    prompts = []
    for image_id in chosen:
        ann = rng.choice(sorted(captions[image_id], key=lambda a: a["id"]))
        prompts.append(Prompt(str(ann["id"]), ann["caption"].strip(),
                              {"image_id": image_id, "file_name": files[image_id]}))
    return prompts
