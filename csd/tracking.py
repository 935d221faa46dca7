"""Weights & Biases tracking of evaluated runs (``logger`` config group).

One W&B run per evaluated run: the run's resolved config and run.json as config, a per-image
table, a grid of sample images, the acceptance heatmaps and the summary metrics. Its id is kept in
the run directory, so evaluating the run again resumes the same W&B run. Runs of one Hydra
multirun share a ``group`` (the sweep directory's name unless ``logger.group`` is set). W&B's own
sweeps need its server, so sweeping is Hydra's job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import wandb
from omegaconf import DictConfig, OmegaConf
from PIL import Image

from csd.evaluation.context import EvalContext
from csd.report.content_plots import heatmap_figure
from csd.report.samples import captioned_grid

#: Hydra writes this file into a multirun's sweep directory
MULTIRUN_MARKER = "multirun.yaml"
#: a run directory's W&B run id: evaluating the run again resumes that W&B run instead of adding one
WANDB_ID_FILE = "wandb_id.txt"


def wandb_run_id(run_dir: Path) -> str:
    """The W&B id stored in ``run_dir``, created (and stored) at the run's first logged evaluation."""
    path = run_dir / WANDB_ID_FILE
    if not path.exists():
        path.write_text(uuid.uuid4().hex[:12] + "\n", encoding="utf-8")
    return path.read_text(encoding="utf-8").strip()


def wandb_group(run_dir: Path, logger: DictConfig) -> str | None:
    """``logger.group``, else the sweep directory's name when the run is a multirun job."""
    if logger.get("group"):
        return str(logger.group)
    sweep = run_dir.resolve().parent
    return sweep.name if (sweep / MULTIRUN_MARKER).exists() else None


def sample_grid(images: Sequence[Path | Image.Image], captions: list[tuple[str, str]], ncols: int = 4) -> np.ndarray:
    """The images (files or in memory) as one ``[H, W, 3]`` uint8 grid, each captioned with its ``(method, prompt)``
    (:func:`csd.report.samples.captioned_grid`)."""
    tiles = [(image, method, prompt) for image, (method, prompt) in zip(images, captions, strict=True)]
    return np.asarray(captioned_grid(tiles, ncols))


def per_image_table(ctx: EvalContext, per_image: dict[str, list], max_images: int) -> wandb.Table:
    """One row per image: identity, the per-image metrics, and a thumbnail for the first ``max_images``."""
    columns = ["prompt_id", "sample", "prompt", *per_image, "image"]
    rows = []
    for i, rec in enumerate(ctx.records):
        image = wandb.Image(ctx.images[i]) if i < max_images else None
        rows.append([rec["prompt_id"], rec["sample"], rec["prompt"], *(v[i] for v in per_image.values()), image])
    return wandb.Table(columns=columns, data=rows)


def log_evaluated_run(ctx: EvalContext, result: dict[str, Any], per_image: dict[str, list], cfg: DictConfig) -> Path:
    """Log one evaluated run to W&B (``cfg.logger``); returns the local W&B run directory."""
    logger = cfg.logger
    run = wandb.init(
        project=logger.project,
        entity=logger.get("entity"),
        group=wandb_group(ctx.run_dir, logger),
        tags=list(logger.get("tags") or []),
        mode=logger.mode,
        dir=str(logger.get("dir") or ctx.run_dir),
        name=f"{ctx.run_dir.name}",
        id=wandb_run_id(ctx.run_dir),
        resume="allow",
        config={"config": OmegaConf.to_container(ctx.run_config), "run": ctx.info},
        reinit="finish_previous",
        settings=wandb.Settings(console="off", silent=True),
    )
    n = int(logger.get("max_images", 16))
    payload: dict[str, Any] = {
        "per_image": per_image_table(ctx, per_image, n),
        "samples": wandb.Image(
            sample_grid(ctx.images[:n], [(result["run"]["method"], r["prompt"]) for r in ctx.records[:n]]),
            caption=f"first {min(n, len(ctx.records))} images",
        ),
    }
    maps = result["content"].get("acceptance_maps")
    if maps is not None:
        fig = heatmap_figure([(result["run"]["method"], maps)])
        payload["acceptance_heatmaps"] = wandb.Image(fig)
        plt.close(fig)
    run.log(payload)
    run.summary.update({k: v for k, v in result["metrics"].items() if v == v})  # NaN-free
    run_dir = Path(run.dir).parent
    run.finish()
    return run_dir
