"""A run's images from its records: every image is a deterministic decode of the tokens its record holds.

The generate stage writes ``images/<prompt_id>_s<sample>.png`` for the user to look at; nothing downstream needs
those files. Readers (the evaluate stage, the study, sample grids, W&B, the GenEval export) take each image from
:class:`RunImages`: the PNG when it is there and readable, else the record's tokens decoded by the run's own model
adapter with the generate stage's decode (:func:`decode_tokens`), whose pixels are the PNG's (PNG is lossless).
``stage=decode`` (:func:`decode_runs`) writes the missing PNGs with the generate stage's encoder
(:func:`csd.records.png_bytes`), byte for byte the files the run wrote.

The decode runs on the kind of device the run decoded on (``fingerprint.json``'s ``device``) unless told otherwise:
the toy model decodes on the CPU anyway, but a real model's VQ decoder may round a pixel differently on another
device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from tqdm import tqdm

from csd.adapters.base import ModelAdapter
from csd.errors import RecordsError
from csd.records import load_records, png_bytes, write_atomic

log = logging.getLogger(__name__)
RUN_INFO_FILE = "run.json"


def decode_tokens(adapter: ModelAdapter, tokens: Sequence[int] | torch.Tensor) -> np.ndarray:
    """One image's body token ids (a record's ``tokens``, or the engine's 1-D tensor) -> its uint8 ``[H, W, 3]`` image:
    the decode of the generate stage, one image at a time (a batched decode might round differently)."""
    ids = torch.as_tensor(tokens, dtype=torch.long, device=adapter.device)
    return adapter.decode_images(ids.unsqueeze(0))[0].numpy()


def run_model_config(run_dir: Path) -> DictConfig:
    """The model group a run was generated with: its ``config.yaml``'s, else the preset run.json names."""
    from csd.presets import model_preset
    from csd.rundir import read_run_file

    path = run_dir / "config.yaml"
    model = OmegaConf.select(OmegaConf.load(path), "model") if path.exists() else None
    if model is not None and "_target_" in model:
        return model
    info_path = run_dir / RUN_INFO_FILE
    if not info_path.exists():
        raise FileNotFoundError(f"{info_path} missing: {run_dir} is not a generated run directory")
    return model_preset(read_run_file(info_path)["model"])


def run_device(run_dir: Path, device: str | None = None) -> torch.device:
    """``device`` when given, else the kind of device the run decoded on (``fingerprint.json``), else ``auto``'s.
    A CUDA run decoded where there is no GPU falls back to the CPU with a warning (a real model's pixels may differ
    in the last bit; the toy's do not)."""
    from csd.device import resolve_device
    from csd.rundir import FINGERPRINT_FILE, read_run_file

    if device is not None:
        return resolve_device(device)
    path = run_dir / FINGERPRINT_FILE
    kind = read_run_file(path).get("keys", {}).get("device") if path.exists() else None
    if kind == "cuda" and not torch.cuda.is_available():
        log.warning("%s was decoded on a GPU and this machine has none: decoding its images on the CPU, where a "
                    "real model's pixels may differ from the run's in the last bit", run_dir)
        return torch.device("cpu")
    return resolve_device(kind or "auto")


def load_run_adapter(run_dir: Path, device: str | None = None) -> ModelAdapter:
    """The run's model adapter (:func:`run_model_config`) on :func:`run_device`, for decoding its tokens."""
    from csd.compose import build_adapter

    return build_adapter(run_model_config(run_dir), run_device(run_dir, device))


def read_png(path: Path) -> np.ndarray | None:
    """The RGB pixels of the PNG at ``path``; None when it is missing or PIL cannot read it (a truncated file)."""
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, ValueError):  # PIL reports broken files with any of these
        return None


class RunImages(Sequence[Image.Image]):
    """The images of a run directory, in the order of ``records`` (default: every record, sorted by prompt id and
    sample, as :func:`csd.records.load_records` gives them), as RGB PIL images; :meth:`array` gives any record's.

    Each is read from its PNG when that is there and readable, else decoded from the record's tokens; the run's
    adapter is built on the first decode only. ``decoded`` counts the images decoded so far.
    """

    def __init__(self, run_dir: str | Path, records: Sequence[dict[str, Any]] | None = None,
                 device: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._records = records
        self.device = device
        self.decoded = 0
        self.unreadable: list[str] = []

    @cached_property
    def records(self) -> Sequence[dict[str, Any]]:
        return load_records(self.run_dir) if self._records is None else self._records

    @cached_property
    def adapter(self) -> ModelAdapter:
        return load_run_adapter(self.run_dir, self.device)

    def decode(self, record: dict[str, Any]) -> np.ndarray:
        """The record's image decoded from its tokens (never read from its PNG)."""
        if len(record["tokens"]) != self.adapter.layout.length:
            raise RecordsError(
                f"{self.run_dir}: {record['prompt_id']} sample {record['sample']} has {len(record['tokens'])} tokens, "
                f"but the run's model ({type(self.adapter).__name__}) decodes images of {self.adapter.layout.length}; "
                "its image cannot be decoded"
            )
        self.decoded += 1
        return decode_tokens(self.adapter, record["tokens"])

    def array(self, record: dict[str, Any]) -> np.ndarray:
        """The record's uint8 ``[H, W, 3]`` image: its PNG's pixels, or its tokens decoded. A PNG that is there but
        unreadable (empty, truncated) is never used; the first is named in one warning (``unreadable`` lists them)."""
        path = self.run_dir / record["image"]
        pixels = read_png(path)
        if pixels is None and path.exists():
            if not self.unreadable:
                log.warning("%s: %s is unreadable (%d bytes); it and any other unreadable PNG of this run are not "
                            "read: their images are decoded from the records' tokens", self.run_dir, record["image"],
                            path.stat().st_size)
            self.unreadable.append(record["image"])
        return self.decode(record) if pixels is None else pixels

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> Image.Image: ...
    @overload
    def __getitem__(self, index: slice) -> list[Image.Image]: ...
    def __getitem__(self, index: int | slice) -> Image.Image | list[Image.Image]:
        if isinstance(index, slice):
            return [Image.fromarray(self.array(r)) for r in self.records[index]]
        return Image.fromarray(self.array(self.records[index]))

    def __iter__(self) -> Iterator[Image.Image]:
        return (Image.fromarray(self.array(r)) for r in self.records)


@dataclass
class Decoded:
    """What ``stage=decode`` did to one run directory."""

    run_dir: Path
    written: int = 0
    #: PNGs already there with the right bytes
    kept: int = 0


def decode_run(run_dir: str | Path, device: str | None = None, progress: bool = True) -> Decoded:
    """Write the PNG of every record of ``run_dir`` (all shards) that is missing or differs from the decode of its
    tokens (each file replaced atomically); a PNG with the right bytes is kept, so an interrupted decode resumes."""
    images = RunImages(run_dir, device=device)
    out = Decoded(images.run_dir)
    if not images.records:
        log.warning("%s: no records yet, nothing to decode", out.run_dir)
        return out
    for record in tqdm(images.records, desc=f"decode {images.run_dir.name}", unit="img", disable=not progress):
        path = images.run_dir / record["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        data = png_bytes(images.decode(record))
        if path.is_file() and path.read_bytes() == data:
            out.kept += 1
            continue
        write_atomic(path, data)
        out.written += 1
    log.info("%s: %d images written, %d already there", out.run_dir, out.written, out.kept)
    return out


def run_dirs_under(target: str | Path) -> list[Path]:
    """``target`` when it is a run directory (has run.json), else every run directory below it (a sweep)."""
    target = Path(target)
    if (target / RUN_INFO_FILE).exists():
        return [target]
    runs = sorted(p.parent for p in target.rglob(RUN_INFO_FILE))
    if not runs:
        raise FileNotFoundError(f"no run directories (with {RUN_INFO_FILE}) in {target}")
    return runs


def decode_runs(target: str | Path, device: str | None = None, progress: bool = True) -> list[Decoded]:
    """``stage=decode``: :func:`decode_run` on the run ``target`` or on every run of the sweep ``target``."""
    return [decode_run(run, device, progress) for run in run_dirs_under(target)]
