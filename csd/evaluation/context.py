"""What every metric of the evaluate stage sees: the run directory's contents and the eval config."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from csd.decode import RunImages
from csd.records import check_records_match, load_located_records

log = logging.getLogger(__name__)


class NotApplicable(Exception):
    """A metric cannot be computed for this run (no reference set, too few images, ...)."""


@dataclass
class MetricOutput:
    """One metric's contribution to ``metrics.json``.

    ``metrics``: scalars (one sweep-table column each); ``per_image``: columns aligned with the
    records; ``protocol``: settings to record next to the numbers; ``content``: arrays for plots;
    ``intervals``: ``[lo, hi]`` of metrics that per-image columns do not determine (FID); ``skipped``: keys of the
    metric that could not be computed, with why (one FID evaluator without its weights).
    """

    metrics: dict[str, float] = field(default_factory=dict)
    per_image: dict[str, list] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    content: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def merge_shard_info(info: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """``info`` plus the shards' generate passes (``run.shard-*.json``): throughput summed over shards (images
    per engine-second of one device) and their batch-1 latency probes concatenated."""
    shards = [json.loads(p.read_text()) for p in sorted(run_dir.glob("run.shard-*-of-*.json"))]
    if not shards:
        return info
    images = sum(s.get("throughput_images", 0) for s in shards)
    seconds = sum(s.get("throughput_engine_s", 0.0) for s in shards)
    merged = {"throughput_images": images, "throughput_engine_s": seconds}
    if seconds > 0:
        merged["throughput_images_per_s"] = images / seconds
    probes = [p for s in shards for p in s.get("latency_probe") or []]
    return info | merged | ({"latency_probe": probes} if probes else {})


@dataclass
class EvalContext:
    """A finished run as the metrics read it; ``eval`` is the ``eval`` config group, ``where[i]`` names the
    records file and line of ``records[i]``."""

    run_dir: Path
    info: dict[str, Any]
    records: list[dict[str, Any]]
    eval: DictConfig
    device: torch.device
    where: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: str | Path, eval_cfg: DictConfig, device: str = "auto") -> EvalContext:
        """Read ``run.json`` and the records of every shard, refusing records that ``run.json`` does not
        describe (a resume sets them aside and redoes them). Per-token fields are typed arrays
        (:func:`csd.records.compact_record`: a 30k-image run at ~9,300 tokens an image is ~4.8 GB so, ~35 GB as lists).
        Images are not read here (:attr:`images`)."""
        run_dir = Path(run_dir)
        info_path = run_dir / "run.json"
        if not info_path.exists():
            raise FileNotFoundError(f"{info_path} missing: {run_dir} is not a generated run directory")
        located = load_located_records(run_dir, compact=True)  # every shard's, sorted by (prompt_id, sample)
        records = [record for _, record in located]
        if not records:
            raise FileNotFoundError(f"no records in {run_dir}: run stage=generate first")
        info = merge_shard_info(json.loads(info_path.read_text()), run_dir)
        where = [at for at, _ in located]
        check_records_match(records, info, where)
        if not (run_dir / "config.yaml").exists():
            log.warning("%s: config.yaml is missing; the run's settings come from run.json (model preset %r; the "
                        "caption-rule check of COCO runs is skipped)", run_dir, info.get("model"))
        dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        return cls(run_dir, info, records, eval_cfg, torch.device(dev), where)

    @cached_property
    def run_config(self) -> DictConfig:
        """The run's own resolved config (``config.yaml``), empty if it was not saved."""
        path = self.run_dir / "config.yaml"
        return OmegaConf.load(path) if path.exists() else OmegaConf.create({})

    @property
    def is_toy(self) -> bool:
        return self.info["model"] in self.eval.toy.models

    @cached_property
    def images(self) -> RunImages:
        """The records' images, in their order: each PNG, or (missing or unreadable) its tokens decoded by the run's
        model (csd.decode); a metric that reads no image loads no model."""
        return RunImages(self.run_dir, self.records)
