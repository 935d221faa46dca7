"""Where a toy model is uncertain: AR target entropy per cell region (object, edge, background) and per background
pattern, with 95 % intervals over images, and example entropy maps (docs/RESULTS.md "A second toy").

    python -m experiments.entropy_map results/toy_paper/0_ar results/entropy_study_textured/ar \\
        [--labels toy toy_textured] [--out results/toy_textured/entropy_map] [--bootstrap 1000] [--examples 6]

Each run directory holds a finished generation of a toy model (``records.jsonl``; its PNGs, or else its tokens decoded
by the run's own model: ``csd.decode.RunImages``). Regions come from the scene checker's segmentation of each generated
image (``csd.evaluation.toy.cell_regions``). Writes ``entropy_map.md``, ``entropy_map.json`` and ``entropy_map.png``.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from csd.decode import RunImages
from csd.evaluation.intervals import percentile_interval
from csd.evaluation.toy import CELL_REGIONS, entropy_by_region
from csd.records import load_records
from csd.toy.domain import BACKGROUNDS

#: the run's own metrics (metrics.json) shown beside its entropy
QUALITY = ("scene_acc_overall", "clip_score", "fid")


def ratio(sums: np.ndarray, counts: np.ndarray, n_boot: int, rng: np.random.Generator) -> dict[str, Any]:
    """Pooled mean ``sum(sums) / sum(counts)`` with a percentile bootstrap interval over images."""
    value = float(sums.sum() / counts.sum()) if counts.sum() else float("nan")
    interval = None
    if n_boot and counts.sum():
        idx = rng.integers(len(sums), size=(n_boot, len(sums)))
        interval = percentile_interval(sums[idx].sum(1) / np.maximum(counts[idx].sum(1), 1))
    return {"value": value, "interval": interval}


def summarise(run_dir: Path, n_boot: int, seed: int = 0) -> dict[str, Any]:
    """Entropy per region of one run, as fractions of log V, with intervals over images."""
    records = load_records(run_dir)
    images = RunImages(run_dir, records)
    found = entropy_by_region(records, images)
    log_v = math.log(int(json.loads((run_dir / "run.json").read_text())["model_info"]["vocab_size"]))
    rng = np.random.default_rng(seed)
    cells = np.array([r["grid"][0] * r["grid"][1] for r in records], dtype=float)
    out: dict[str, Any] = {"run": str(run_dir), "model": records[0]["model"], "method": records[0]["method"],
                           "images": len(records), "log_v": log_v}
    body = np.array(found["per_image"]["body"]) * cells / log_v
    out["body"] = ratio(body, cells, n_boot, rng)
    for name in CELL_REGIONS:
        share = np.array(found["share"][name])
        counts = share * cells
        means = np.nan_to_num(np.array(found["per_image"][name]))
        values = found["values"][name] / log_v
        out[name] = {"share": float(counts.sum() / cells.sum()), **ratio(means * counts / log_v, counts, n_boot, rng),
                     "quantiles": {q: float(np.quantile(values, q)) if values.size else float("nan")
                                   for q in (0.1, 0.5, 0.9)}}
    background = np.nan_to_num(np.array(found["per_image"]["background"])) * np.array(found["share"]["background"])
    out["background_by_pattern"] = {}
    for pattern in BACKGROUNDS:
        pick = np.array([r["meta"].get("background") == pattern for r in records])
        if pick.any():
            counts = np.array(found["share"]["background"])[pick] * cells[pick]
            out["background_by_pattern"][pattern] = ratio(background[pick] * cells[pick] / log_v, counts, n_boot, rng)
    metrics_file = run_dir / "metrics.json"
    if metrics_file.exists():
        metrics = json.loads(metrics_file.read_text())
        out["quality"] = {k: {"value": metrics["metrics"][k], "interval": metrics["intervals"].get(k)}
                          for k in QUALITY if k in metrics["metrics"]}
    return out


def fmt(cell: dict[str, Any]) -> str:
    iv = cell["interval"]
    return f"{cell['value']:.3f} [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else f"{cell['value']:.3f}"


def markdown(rows: list[dict[str, Any]], labels: list[str]) -> str:
    lines = ["# AR target entropy by region", "",
             "Fractions of log V (nats / log V); 95 % bootstrap intervals over images; share = the region's fraction of "
             "the body's cells (regions from the scene checker's segmentation of each image: object = every pixel of "
             "the 2x2 cell an object's, edge = some, background = none).", "",
             "| run | images | body | object (share) | edge (share) | background (share) |", "|---|---|---|---|---|---|"]
    for label, r in zip(labels, rows, strict=True):
        regions = " | ".join(f"{fmt(r[n])} ({r[n]['share']:.2f})" for n in CELL_REGIONS)
        lines.append(f"| {label} | {r['images']} | {fmt(r['body'])} | {regions} |")
    lines += ["", "Quantiles of a position's entropy (10 / 50 / 90 %), fractions of log V:", "",
              "| run | " + " | ".join(CELL_REGIONS) + " |", "|---|" + "---|" * len(CELL_REGIONS)]
    for label, r in zip(labels, rows, strict=True):
        cells = " | ".join(" / ".join(f"{v:.2f}" for v in r[n]["quantiles"].values()) for n in CELL_REGIONS)
        lines.append(f"| {label} | {cells} |")
    lines += ["", "Background cells by the caption's pattern:", "",
              "| run | " + " | ".join(BACKGROUNDS) + " |", "|---|" + "---|" * len(BACKGROUNDS)]
    for label, r in zip(labels, rows, strict=True):
        by = r["background_by_pattern"]
        lines.append(f"| {label} | " + " | ".join(fmt(by[b]) if b in by else "n/a" for b in BACKGROUNDS) + " |")
    keys = [k for k in QUALITY if any(k in r.get("quality", {}) for r in rows)]
    if keys:
        lines += ["", "Each run's own metrics (metrics.json, 95 % intervals):", "",
                  "| run | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for label, r in zip(labels, rows, strict=True):
            q = r.get("quality", {})
            lines.append(f"| {label} | " + " | ".join(fmt(q[k]) if k in q else "n/a" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def figure(run_dirs: list[Path], labels: list[str], examples: int, path: Path) -> None:
    """Per run, ``examples`` images (the first prompts) above their entropy maps (fraction of log V, one scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from csd.evaluation.content import on_grid

    fig, axes = plt.subplots(2 * len(run_dirs), examples, figsize=(1.6 * examples, 3.3 * len(run_dirs)), squeeze=False)
    mappable = None
    for i, (run_dir, label) in enumerate(zip(run_dirs, labels, strict=True)):
        records = load_records(run_dir)[:examples]
        log_v = math.log(int(json.loads((run_dir / "run.json").read_text())["model_info"]["vocab_size"]))
        for j, (r, image) in enumerate(zip(records, RunImages(run_dir, records), strict=True)):
            axes[2 * i, j].imshow(image, interpolation="nearest")
            mappable = axes[2 * i + 1, j].imshow(on_grid(r, "entropy") / log_v, vmin=0, vmax=0.8, cmap="magma")
            for ax in (axes[2 * i, j], axes[2 * i + 1, j]):
                ax.set_xticks([])
                ax.set_yticks([])
        axes[2 * i, 0].set_ylabel(label, fontsize=8)
        axes[2 * i + 1, 0].set_ylabel("H / log V", fontsize=8)
    fig.colorbar(mappable, ax=axes, shrink=0.6)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.entropy_map", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished toy run directories")
    parser.add_argument("--labels", nargs="*", default=None, help="one per run (default: the run's directory name)")
    parser.add_argument("--out", type=Path, default=Path("results/toy_textured/entropy_map"))
    parser.add_argument("--bootstrap", type=int, default=1000, help="image resamples of the intervals")
    parser.add_argument("--examples", type=int, default=6, help="images per run in the figure")
    args = parser.parse_args()
    labels = args.labels or [r.name for r in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    for run in args.runs:
        if not (run / "records.jsonl").exists() or not (run / "run.json").exists():
            parser.error(f"{run} is not a finished run directory (records.jsonl and run.json)")
    if args.bootstrap < 0 or args.examples < 1:
        parser.error(f"--bootstrap={args.bootstrap} must be >= 0 and --examples={args.examples} >= 1")
    rows = [summarise(run, args.bootstrap) for run in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "entropy_map.json").write_text(json.dumps(dict(zip(labels, rows, strict=True)), indent=2) + "\n")
    (args.out / "entropy_map.md").write_text(markdown(rows, labels))
    figure(args.runs, labels, args.examples, args.out / "entropy_map.png")
    print(f"{args.out / 'entropy_map.md'}\n{args.out / 'entropy_map.png'}")


if __name__ == "__main__":
    main()
