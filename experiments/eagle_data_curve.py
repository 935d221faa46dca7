"""The toy EAGLE head's data curve: heads trained on the first 64 / 256 / 512 AR samples of the toy's training split,
step compression of ``method=sjd drafter=eagle`` on held-out prompts, with 95 % intervals (docs/DRAFT_HEADS.md).

Usage, from the repository root::

    HF_HUB_OFFLINE=1 python -m experiments.eagle_data_curve --threads 1 \\
        --reference csd/toy/assets/eagle_head.pt --out results/toy_drafters/eagle_data_curve

1. collect (``experiments.train_drafter.collect``): one AR sample of each of the first ``max(--sizes)`` prompts of
   ``dataset=toy dataset.split=train``, sample ``i`` with ``csd.pipeline.image_seed(--seed, i, 0)``; cached in
   ``--work`` (``data.pt``). These are the samples ``python -m experiments.train_drafter model=toy dataset=toy
   dataset.split=train dataset.n_prompts=<n + 8> --val-prompts 8`` trains on, so each head here is the head that
   command gives for ``n`` (same initialisation, batches and noise: ``experiments.train_drafter.train``).
2. train: a head on the first ``n`` samples for each ``n`` in ``--sizes`` (in that order), ``--steps`` steps each (the
   same number of steps for every ``n``, so fewer samples are seen more often); ``--work/head_<n>.pt``, kept between
   invocations, as are the evaluations (``--work/rows_*.json``).
3. evaluate (the ``--reference`` heads first, then each head after its training): ``method=sjd drafter=eagle`` (``--window``) on the first ``--eval-prompts`` held-out prompts
   (``dataset=toy``, the prompts of ``toy_paper`` and ``toy_drafters``) with the seeds ``run.py`` gives them
   (``image_seed(0, i, 0)``), for each head and for ``--reference`` heads; step compression (tokens per target
   forward, mean over images) and drafts accepted per proposed, each with its 95 % cluster-bootstrap interval over
   prompts, and each head's paired difference in step compression against the first ``--reference``
   (``csd.evaluation.intervals``). Written to ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from csd.acceptance import SJD
from csd.adapters.base import ModelAdapter
from csd.adapters.toy import load_toy_adapter
from csd.drafters.eagle import EagleDrafter, EagleHead, head_config, save_head
from csd.engine import JacobiEngine
from csd.evaluation.intervals import paired_difference, point_estimates, run_intervals
from csd.pipeline import image_seed, write_json
from csd.slot import Request
from csd.toy.domain import heldout_prompts, toy_prompts
from experiments import train_drafter

#: bootstrap resamples of every interval
N_BOOT = 2000


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.eagle_data_curve", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,256,512", help="training samples of each head, comma-separated")
    parser.add_argument("--steps", type=int, default=600, help="training steps of each head")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--token-weight", type=float, default=0.1)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the samples, initialisation and batches")
    parser.add_argument("--save-every", type=int, default=200, help="training checkpoint interval (steps)")
    parser.add_argument("--window", type=int, default=5, help="drafter.window of the evaluation")
    parser.add_argument("--eval-prompts", type=int, default=100, help="the first held-out prompts")
    parser.add_argument("--decode-batch", type=int, default=16, help="images in flight when sampling / evaluating")
    parser.add_argument("--reference", type=Path, action="append", default=[],
                        help="a head evaluated next to the curve's (repeatable; the first is the paired reference)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "eagle_data_curve",
                        help="the samples (about 200 MB for 512), the trained heads and the evaluations, kept between "
                             "invocations")
    parser.add_argument("--out", type=Path, required=True, help="<out>.json and <out>.md are written")
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args(argv)


def head_for(adapter: ModelAdapter, data: dict[str, torch.Tensor], n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train (or find) the head on the first ``n`` samples: ``{"file", "samples", "steps", "train_s", ...}``."""
    file, ckpt = args.work / f"head_{n}.pt", args.work / f"head_{n}.ckpt"
    info_file = file.with_suffix(".json")
    if file.exists() and info_file.exists():
        return json.loads(info_file.read_text())
    ckpt.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    net = EagleHead(head_config(adapter.decoder().config)).to(adapter.device)
    start = time.perf_counter()
    log = train_drafter.train(net, adapter, {k: v[:n] for k, v in data.items()}, args, ckpt)
    meta = {"model": "toy", "dataset": "toy", "train_prompts": n, "samples_per_prompt": 1, "steps": args.steps,
            "seed": args.seed}
    save_head(net, file, meta)
    info = {"file": str(file), "samples": n, "steps": args.steps, "train_s": round(time.perf_counter() - start, 1),
            "first_loss": log[0]["loss"], "last_loss": log[-1]["loss"], "last_top1": log[-1]["top1"]}
    write_json(info_file, info)
    return info


@torch.no_grad()
def evaluate(adapter: ModelAdapter, head: Path, name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per-image rows of ``method=sjd drafter=eagle`` with ``head`` on the first ``--eval-prompts`` held-out prompts
    (kept as ``--work/rows_<name>.json``)."""
    rows_file = args.work / f"rows_{name}.json"
    if rows_file.exists():
        return json.loads(rows_file.read_text())["rows"]
    prompts = heldout_prompts(args.eval_prompts)
    engine = JacobiEngine(adapter, SJD(), EagleDrafter(window=args.window, head=str(head)), batch_size=args.decode_batch)
    requests = [Request(p.text, image_seed(0, i, 0), key=i) for i, p in enumerate(prompts)]
    rows = [None] * len(prompts)
    for request, gen in tqdm(engine.generate_many(requests), total=len(requests), desc=head.name):
        rows[request.key] = {"prompt_id": prompts[request.key].prompt_id, "sample": 0,
                             "step_compression": gen.step_compression, "drafts_accepted": gen.stats["drafts_accepted"],
                             "drafts_proposed": gen.stats["drafts_proposed"]}
    write_json(rows_file, {"rows": rows})
    return rows


def summary(name: str, rows: list[dict[str, Any]], reference: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Step compression and acceptance rate with intervals; the paired step-compression difference to ``reference``."""
    ids = [r["prompt_id"] for r in rows]
    columns = {k: [r[k] for r in rows] for k in ("step_compression", "drafts_accepted", "drafts_proposed")}
    point = point_estimates(ids, columns)
    intervals = run_intervals(ids, columns, ["step_compression", "acceptance_rate"], N_BOOT)
    out = {"head": name, "images": len(rows),
           "step_compression": point["step_compression"], "step_compression_ci": intervals["step_compression"],
           "acceptance_rate": point["acceptance_rate"], "acceptance_rate_ci": intervals["acceptance_rate"]}
    if reference is not None:
        diff = paired_difference(rows, reference, "step_compression", N_BOOT)
        out |= {"step_compression_vs_reference": diff.value, "step_compression_vs_reference_ci": diff.interval}
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    fmt = lambda v, ci: f"{v:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"  # noqa: E731
    lines = [f"# Toy EAGLE head: data curve\n\n`{report['command']}`\n\n{report['setting']}\n",
             "| head | training samples | steps | step compression | drafts accepted / proposed | "
             "Δ step compression vs reference |", "|---|---|---|---|---|---|"]
    for row in report["rows"]:
        delta = (fmt(row["step_compression_vs_reference"], row["step_compression_vs_reference_ci"])
                 if "step_compression_vs_reference" in row else "")
        acc = f"{row['acceptance_rate']:.3f} [{row['acceptance_rate_ci'][0]:.3f}, {row['acceptance_rate_ci'][1]:.3f}]"
        lines.append(f"| {row['head']} | {row.get('samples', '')} | {row.get('steps', '')} | "
                     f"{fmt(row['step_compression'], row['step_compression_ci'])} | {acc} | {delta} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict[str, Any]:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.sizes.split(",")]
    adapter = load_toy_adapter()
    args.work.mkdir(parents=True, exist_ok=True)
    data_file = args.work / "data.pt"
    seeds = train_drafter.sample_seeds(args.seed, 0, max(sizes), 1)
    if data_file.exists():
        data = train_drafter.load_samples(data_file, seeds)
    else:
        data = train_drafter.collect(adapter, toy_prompts(max(sizes), "train"), 1, args.seed, args.decode_batch)
        torch.save(data, data_file)
    report = {"command": "python -m experiments.eagle_data_curve " + " ".join(argv),
              "setting": (f"`method=sjd drafter=eagle drafter.window={args.window}`, the first {args.eval_prompts} "
                          "held-out toy prompts (`dataset=toy`, seeds as `run.py` gives them, seed 0), one image "
                          f"each, batch {args.decode_batch}; 95 % cluster-bootstrap intervals over prompts "
                          f"({N_BOOT} resamples); Δ paired against the first reference head."),
              "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def add(row: dict[str, Any]) -> None:  # the report is rewritten after each head
        report["rows"].append(row)
        write_json(args.out.with_suffix(".json"), report)
        args.out.with_suffix(".md").write_text(markdown(report))

    reference_rows = None
    for k, ref in enumerate(args.reference):
        per_image = evaluate(adapter, ref, f"reference_{k}", args)
        add({**summary(str(ref), per_image, reference_rows), "file": str(ref)})
        reference_rows = reference_rows or per_image
    for n in sizes:
        head = head_for(adapter, data, n, args)
        per_image = evaluate(adapter, Path(head["file"]), f"head_{n}", args)
        add({**summary(f"retrained, {n} samples", per_image, reference_rows), **head})
    print(markdown(report), flush=True)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
