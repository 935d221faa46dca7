"""Hydra callback that builds the sweep report once every job of a multirun has finished."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class SweepReportCallback(Callback):
    """``on_multirun_end``: :func:`csd.report.build.build_report` over ``hydra.sweep.dir`` (jobs must have run ``evaluate``)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("stage") not in ("evaluate", "all"):
            log.info("stage=%s: no metrics to report for the sweep", config.get("stage"))
            return
        if OmegaConf.select(config, "dataset.num_shards", default=1) > 1:  # shard jobs only generate
            log.info("sharded run: evaluate it once every shard is done (stage=evaluate run_dir=...), then report")
            return
        from csd.report.build import build_report  # pandas and matplotlib: only when a sweep ends

        build_report(Path(config.hydra.sweep.dir), config)
