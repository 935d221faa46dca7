"""The run directory: per-image records, images, and resume.

Layout of a run directory (everything later stages read; they never touch engine internals)::

    <run_dir>/
      config.yaml        the resolved Hydra config of the run
      run.json           method, model protocol facts (adapter.describe()), dataset, versions
      records.jsonl      one JSON object per finished image (fields: see ImageRecord)
      images/<prompt_id>_s<sample>.png
      metrics.json       written by the evaluate stage

A record line is written with a single ``write`` + ``fsync`` after its PNG is in place, so an
interrupted run leaves at most one incomplete trailing line, which :func:`load_records` drops (and
:class:`RecordWriter` truncates away before appending).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

RECORDS_FILE = "records.jsonl"
IMAGES_DIR = "images"

#: values of ``ImageRecord.commit_kind``: how each body position was committed
COMMIT_SAMPLED, COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_FORCED = 0, 1, 2, 3


@dataclass
class ImageRecord:
    """Everything measured for one generated image.

    Counters follow EVALUATION.md: ``nfe`` counts target forwards during image decoding (CFG rows
    batched = one), ``step_compression = len(tokens) / nfe`` (forced tokens included).
    ``drafts_proposed`` counts free-position drafts placed in windows, ``drafts_verified`` those the
    rule looked at (up to and including the first rejection), ``drafts_accepted`` those accepted,
    ``relaxed_accepts`` accepted drafts the lossless rule ``min(1, q/p)`` would have rejected with
    the same uniform. ``filter_checks`` / ``filter_passes``: CSD's TV filter on verified drafts.
    Per body position: ``commit_iter`` (iteration that committed it), ``commit_kind``
    (COMMIT_* above), ``entropy`` (nats of the processed target distribution it was committed under).
    """

    prompt_id: str
    prompt: str
    sample: int
    seed: int
    method: str
    method_params: dict[str, Any]
    model: str
    image: str
    tokens: list[int]
    grid: list[int]
    nfe: int
    iterations: int
    step_compression: float
    drafts_proposed: int
    drafts_verified: int
    drafts_accepted: int
    relaxed_accepts: int
    filter_checks: int
    filter_passes: int
    prefill_s: float
    decode_s: float
    vq_decode_s: float
    latency_s: float
    commit_iter: list[int]
    commit_kind: list[int]
    entropy: list[float]
    meta: dict[str, Any]

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt_id, self.sample)


def image_name(prompt_id: str, sample: int) -> str:
    return f"{IMAGES_DIR}/{prompt_id}_s{sample}.png"


def load_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """All complete records of a run (an incomplete trailing line from a crash is ignored)."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                out.append(json.loads(line))
    return out


class RecordWriter:
    """Appends records and images to a run directory; knows which (prompt, sample) pairs are done."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        (self.run_dir / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS_FILE
        self._drop_incomplete_tail()
        self.done = {(r["prompt_id"], r["sample"]) for r in load_records(self.run_dir)}

    def _drop_incomplete_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(keep)

    def write(self, record: ImageRecord, image: np.ndarray) -> None:
        """Save the PNG (atomically), then append the record line in one write."""
        png = self.run_dir / record.image
        tmp = png.with_suffix(".tmp.png")
        Image.fromarray(image).save(tmp)
        os.replace(tmp, png)
        line = json.dumps(asdict(record), separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.done.add(record.key)
