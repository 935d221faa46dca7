"""Stage dispatch behind ``run.py``: generate -> evaluate -> report, with short errors for bad input."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from csd.adapters.base import MissingWeightsError
from csd.config import ConfigError, validate

log = logging.getLogger("csd")


def in_multirun() -> bool:
    """True inside a Hydra multirun job: the sweep report is built once at the end (SweepReportCallback)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_stages(cfg: DictConfig) -> None:
    """Run ``cfg.stage``; configuration and missing-file errors end the run with one clear line."""
    try:
        validate(cfg)
        run_dir = Path(cfg.run_dir)
        if cfg.stage in ("generate", "all"):
            from csd.pipeline import generate_run

            generate_run(cfg)
        if cfg.stage in ("evaluate", "all"):
            from csd.evaluation import evaluate_run

            evaluate_run(run_dir, cfg)
        if cfg.stage == "report" or (cfg.stage == "all" and not in_multirun()):
            from csd.report import build_report

            target = Path(cfg.sweep_dir) if cfg.stage == "report" and cfg.sweep_dir else run_dir
            report = build_report(target, cfg)
            for table in sorted(report.glob("table_*.md")):
                print(table.read_text())
            print(f"report: {report}")
    except (ConfigError, MissingWeightsError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
