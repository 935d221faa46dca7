"""Target-entropy scale of finished runs: how confident the model is per position, in nats and as a share of
``log V`` (CSD's ``entropy_norm=log_vocab``), to compare models before transferring an entropy knob (CSD's ``lam``,
entropy-aware SJD's ``e``; docs/RESULTS.md "Is entropy the right signal?").

    python -m experiments.entropy_scale results/entropy_study/ar [more run dirs] [--out entropy_scale.md]

Reads each run's ``records.jsonl`` (the target entropy ``H(q)`` recorded at every committed image position;
forced structural positions such as Lumina-mGPT's end-of-line tokens are left out) and ``run.json`` (``V``).
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

from csd.evaluation.content import on_grid
from csd.records import load_records


def entropy_scale(run_dir: Path) -> dict[str, Any]:
    """Mean, 10/50/90 % quantiles and share below 0.001 nats of a run's per-position target entropy, and the mean
    divided by ``log V`` (V = the image vocabulary the target distribution is over)."""
    info = json.loads((run_dir / "run.json").read_text())
    records = load_records(run_dir)
    if not records:
        raise SystemExit(f"{run_dir}: no records (generate the run first)")
    h = np.concatenate([on_grid(r, "entropy").astype(float).ravel() for r in records])
    vocab = int(info["model_info"]["vocab_size"])
    q10, q50, q90 = np.quantile(h, [0.1, 0.5, 0.9])
    return {"run": str(run_dir), "model": info["model"], "method": info["method"], "vocab": vocab,
            "images": len(records), "positions": int(h.size), "mean": float(h.mean()), "q10": float(q10),
            "q50": float(q50), "q90": float(q90), "below_1e-3": float((h < 1e-3).mean()),
            "mean_over_log_v": float(h.mean() / math.log(vocab))}


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| run | model | method | V | images | mean H (nats) | q10 / q50 / q90 | share < 0.001 | mean H / log V |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['run']} | {r['model']} | {r['method']} | {r['vocab']} | {r['images']} | {r['mean']:.3f} | "
                     f"{r['q10']:.3g} / {r['q50']:.3g} / {r['q90']:.3g} | {r['below_1e-3']:.2f} | "
                     f"{r['mean_over_log_v']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.entropy_scale",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories (AR runs show the model's own scale)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    for run in args.runs:
        if not (run / "run.json").exists():
            parser.error(f"{run} is not a run directory (no run.json)")
    table = markdown([entropy_scale(run) for run in args.runs])
    print(table, end="")
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
