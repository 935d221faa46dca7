"""Fake run directories in the contract's schema (run.json, config.yaml, records.jsonl, images/)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_SAMPLED, ImageRecord, RecordWriter, image_name

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
REPO = Path(__file__).resolve().parents[2]


def solid_image(value: int, size: int = 32, noise: int = 0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.full((size, size, 3), value, dtype=np.int16) + rng.integers(-noise, noise + 1, (size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_run(
    run_dir: Path,
    method: str = "ar",
    model: str = "toy",
    dataset: str = "toy",
    n_images: int = 4,
    grid: tuple[int, int] = (4, 4),
    latency: float = 1.0,
    method_params: dict[str, Any] | None = None,
    relaxed_every: int = 0,
    metas: list[dict[str, Any]] | None = None,
    images: list[np.ndarray] | None = None,
    tokens: list[list[int]] | None = None,
) -> Path:
    """A finished run: ``n_images`` records whose latencies are ``latency * (1, 2, ...)``/mean-normalised; ``tokens``
    (per image; default ``0 .. grid size - 1``) are the records' (their PNGs are ``images``, not decodes of them)."""
    params = {"name": method, "window": 1 if method == "ar" else 16, "init": "random", **(method_params or {})}
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"method": method, "method_params": params, "model": model,
            "model_info": {"adapter": "Fake", "vocab_size": 8, "grid": list(grid)},
            "dataset": dataset, "seed": 0, "n_images": n_images}
    (run_dir / "run.json").write_text(json.dumps(info))
    OmegaConf.save(OmegaConf.create({"method": params, "model": {"name": model},
                                     "dataset": {"name": dataset, "fid_reference": None}}), run_dir / "config.yaml")
    writer = RecordWriter(run_dir)
    n_pos = grid[0] * grid[1]
    for i in range(n_images):
        kinds = [COMMIT_SAMPLED if method == "ar" or p % 2 == 0 else COMMIT_ACCEPTED for p in range(n_pos)]
        if relaxed_every:
            kinds = [COMMIT_RELAXED if p % relaxed_every == 1 else k for p, k in enumerate(kinds)]
        accepted = sum(k != COMMIT_SAMPLED for k in kinds)
        nfe = n_pos - accepted
        rec = ImageRecord(
            prompt_id=f"p{i:03d}", prompt=f"caption {i}", sample=0, seed=i, method=method, method_params=params,
            model=model, image=image_name(f"p{i:03d}", 0), tokens=tokens[i] if tokens else list(range(n_pos)),
            grid=list(grid), nfe=nfe,
            iterations=nfe, step_compression=n_pos / nfe, drafts_proposed=0 if method == "ar" else 2 * n_pos,
            drafts_verified=n_pos, drafts_accepted=accepted, relaxed_accepts=kinds.count(COMMIT_RELAXED),
            filter_checks=n_pos, filter_passes=n_pos // 2, prefill_s=0.01, decode_s=latency * (i + 1) / 2.5,
            vq_decode_s=0.001, latency_s=latency * (i + 1) / ((n_images + 1) / 2), commit_iter=list(range(n_pos)),
            commit_kind=kinds, entropy=[p / n_pos * 2.0 for p in range(n_pos)], meta=(metas or [{}] * n_images)[i],
        )
        writer.write(rec, images[i] if images is not None else solid_image(40 * i, seed=i))
    return run_dir


def eval_cfg(tmp_path: Path, **overrides: Any) -> Any:
    """The real ``conf/eval/default.yaml`` with a temporary cache and W&B off, plus dotted overrides."""
    cfg = OmegaConf.create({
        "eval": OmegaConf.load(REPO / "conf/eval/default.yaml"),
        "logger": OmegaConf.load(REPO / "conf/logger/disabled.yaml"),
        "device": "cpu",
    })
    cfg.eval.fid.cache_dir = str(tmp_path / "cache")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def test_fixture_run_matches_contract(tmp_path: Path) -> None:
    from csd.records import load_records

    run = make_run(tmp_path / "r", method="csd", n_images=3, relaxed_every=4)
    recs = load_records(run)
    assert len(recs) == 3 and (run / recs[0]["image"]).exists()
    assert set(json.loads((run / "run.json").read_text())) >= {"method", "method_params", "model", "model_info",
                                                               "dataset", "seed", "n_images"}
