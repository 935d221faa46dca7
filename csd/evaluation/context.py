"""What every metric of the evaluate stage sees: the run directory's contents and the eval config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from csd.records import RECORDS_FILE, check_records_match, load_records


class NotApplicable(Exception):
    """A metric cannot be computed for this run (no reference set, too few images, ...)."""


@dataclass
class MetricOutput:
    """One metric's contribution to ``metrics.json``.

    ``metrics``: scalars (one sweep-table column each); ``per_image``: columns aligned with the
    records; ``protocol``: settings to record next to the numbers; ``content``: arrays for plots.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    per_image: dict[str, list] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    content: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalContext:
    """A finished run as the metrics read it; ``eval`` is the ``eval`` config group."""

    run_dir: Path
    info: dict[str, Any]
    records: list[dict[str, Any]]
    eval: DictConfig
    device: torch.device

    @classmethod
    def load(cls, run_dir: str | Path, eval_cfg: DictConfig, device: str = "auto") -> EvalContext:
        """Read ``run.json`` and the records, refusing records that ``run.json`` does not describe."""
        run_dir = Path(run_dir)
        info_path = run_dir / "run.json"
        if not info_path.exists():
            raise FileNotFoundError(f"{info_path} missing: {run_dir} is not a generated run directory")
        records = load_records(run_dir)
        if not records:
            raise FileNotFoundError(f"no records in {run_dir}: run stage=generate first")
        info = json.loads(info_path.read_text())
        check_records_match(records, info, run_dir / RECORDS_FILE)
        dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        return cls(run_dir, info, records, eval_cfg, torch.device(dev))

    @cached_property
    def run_config(self) -> DictConfig:
        """The run's own resolved config (``config.yaml``), empty if it was not saved."""
        path = self.run_dir / "config.yaml"
        return OmegaConf.load(path) if path.exists() else OmegaConf.create({})

    @property
    def is_toy(self) -> bool:
        return self.info["model"] in self.eval.toy.models

    @property
    def image_paths(self) -> list[Path]:
        return [self.run_dir / r["image"] for r in self.records]
