"""How the stages after generation scale with the number of images: ``stage=evaluate``, ``stage=report`` and reading a
run's records, at N images (docs/PERFORMANCE.md, "Scale").

For each N, a synthetic run of N images is made from a real run directory (``--template``, a one-image rehearsal run:
``experiments/synth_run.py``), once, under ``--work``. Each stage then runs as ``python run.py ...`` in a fresh
process, timed by the wall clock, its peak resident memory read from the kernel's accounting of that process
(``os.wait4``'s ``ru_maxrss``: the process and the children it waited for). The same commands on the template's single
image give the interpreter's own figure (its imports), printed beside each peak as ``above_base_mb``.

- ``evaluate``: ``eval.metrics=--metrics`` (``speed content``: the records' metrics; an image metric with its real
  network where its weights are here, e.g. ``--weights-dir`` of random-weight files, see ``--standin``);
- ``report``: the run's report (tables, Pareto figure, the HTML page);
- ``records``: ``csd.records.load_records`` of the run, its time, and the records file's bytes per image;
  ``--record-grids`` adds records-only runs on other token grids (``96x97``: ~9,300 tokens an image, the newest models
  at 768 px), measured by ``records`` and ``evaluate`` (their metrics must read no image).

``--standin DIR`` writes random-weight files of the real feature networks (torch-fidelity's Inception-v3, open_clip
ViT-B-16) into ``DIR`` and points the evaluation at them (``eval.fid.inception_weights``, ``eval.clip.pretrained``, the
precision / recall and Inception Score networks): the real code paths at their real input sizes, with values that mean
nothing. FID's reference set is synthetic too (``--reference-images``, ``eval.fid.paired=false``).

    python -m experiments.bench_eval_scale --template /tmp/tmpl/janus_384 --work /tmp/scale --images 1000 5000 30000 \\
        --json results/bench/eval_scale_cpu.jsonl
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from csd.records import load_records
from experiments.synth_run import write_reference, write_run

READ_RECORDS = ("import json, sys, time; import csd; from csd.records import load_records; t = time.perf_counter(); "
                "n = len(load_records(sys.argv[1])); print(json.dumps({'read_s': time.perf_counter() - t, 'n': n, "
                "'csd': csd.__file__}))")
ENV = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def measure(cmd: list[str], cwd: Path) -> dict[str, Any]:
    """Run ``cmd`` in a fresh process: wall seconds, peak resident MB (``os.wait4``'s ``ru_maxrss``), exit code, the
    last line it printed."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=os.environ | ENV, text=True, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        lines = out.read().strip().splitlines()
        if proc.returncode:
            print(err.read()[-2000:], file=sys.stderr)
    return {"wall_s": round(wall, 3), "peak_mb": round(usage.ru_maxrss / 1024, 1), "rc": proc.returncode,
            "last": lines[-1] if lines else ""}


def run_stage(stage: str, run_dir: Path, overrides: list[str], out_dir: Path, checkout: Path) -> dict[str, Any]:
    """``python run.py stage=<stage> run_dir=<run_dir> <overrides>`` in ``checkout``, measured."""
    return measure([sys.executable, "run.py", f"stage={stage}", f"run_dir={run_dir}", "logger=disabled", "device=cpu",
                    f"eval.report.out_dir={out_dir}", *overrides], checkout)


def read_records(run_dir: Path, checkout: Path) -> dict[str, Any]:
    """Time of ``load_records`` in a fresh process (``checkout``'s), its peak, and the records file's bytes per
    image."""
    got = measure([sys.executable, "-c", READ_RECORDS, str(run_dir)], checkout)
    inner = json.loads(got.pop("last"))
    size = (run_dir / "records.jsonl").stat().st_size
    return got | inner | {"bytes_per_image": round(size / inner["n"], 1), "records_mb": round(size / 2**20, 1)}


def synthetic(template: Path, work: Path, n: int, grid: tuple[int, int] | None = None) -> Path:
    """The synthetic run of ``n`` images under ``work`` (on ``grid``: records only; made once, a finished one carries
    ``.synth_done``)."""
    out = work / (f"{template.name}_n{n}" + ("" if grid is None else f"_g{grid[0]}x{grid[1]}"))
    if not (out / ".synth_done").exists():
        print(f"writing {out} ...", flush=True)
        write_run(template, out, n, grid, images=grid is None)
        (out / ".synth_done").touch()
    return out


def standin_weights(folder: Path) -> list[str]:
    """Random-weight files of the real feature networks in ``folder``; the overrides that point the metrics at them."""
    import open_clip
    import torch
    import torch_fidelity.feature_extractor_inceptionv3 as tf_inception

    folder.mkdir(parents=True, exist_ok=True)
    inception, clip = folder / "inception_random.pth", folder / "clip_vit_b16_random.bin"
    if not inception.exists():
        load = tf_inception.FeatureExtractorInceptionV3.load_state_dict
        tf_inception.load_state_dict_from_url = lambda *a, **k: {}
        tf_inception.FeatureExtractorInceptionV3.load_state_dict = lambda self, state: None
        try:
            net = tf_inception.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
        finally:
            tf_inception.FeatureExtractorInceptionV3.load_state_dict = load
        torch.save(net.state_dict(), inception)
    if not clip.exists():
        torch.save(open_clip.create_model("ViT-B-16", pretrained=None).state_dict(), clip)
    return [f"eval.fid.inception_weights={inception}", f"eval.clip.pretrained={clip}",
            f"eval.inception_score.inception_weights={inception}",
            f"eval.precision_recall.inception_weights={inception}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_eval_scale",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", type=Path, required=True, help="a one-image run directory made by the pipeline")
    parser.add_argument("--work", type=Path, required=True, help="where the synthetic runs are written (kept)")
    parser.add_argument("--images", type=int, nargs="+", default=[1000, 5000, 30000])
    parser.add_argument("--metrics", nargs="+", default=["speed", "content"], help="eval.metrics of the evaluation")
    parser.add_argument("--stages", nargs="+", default=["records", "evaluate", "report"],
                        choices=["records", "evaluate", "report"])
    parser.add_argument("--record-grids", nargs="*", default=[], help="records-only runs on these grids, ROWSxCOLS")
    parser.add_argument("--grid-images", type=int, nargs="+", default=[1000, 5000],
                        help="the records-only runs' sizes (lists of Python numbers: ~1.3 MB an image at 9,300 tokens)")
    parser.add_argument("--standin", type=Path, default=None, help="random-weight feature networks written here")
    parser.add_argument("--reference-images", type=int, default=1000, help="FID's synthetic reference set")
    parser.add_argument("--bootstrap", type=int, default=1000, help="eval.bootstrap")
    parser.add_argument("--checkout", type=Path, default=Path.cwd(),
                        help="the checkout whose run.py and csd run the stages (an older one: the 'before' figures)")
    parser.add_argument("--json", type=Path, default=None, help="append one line per measurement")
    args = parser.parse_args(argv)
    overrides = [f"eval.metrics=[{','.join(args.metrics)}]", f"eval.bootstrap={args.bootstrap}"]
    if args.standin is not None:
        overrides += standin_weights(args.standin)
    if set(args.metrics) & {"fid", "precision_recall"}:
        reference = args.work / f"{args.template.name}_reference_{args.reference_images}"
        if not (reference / ".synth_done").exists():
            write_reference(args.template, reference, args.reference_images)
            (reference / ".synth_done").touch()
        overrides += [f"eval.fid.reference_dir={reference}", "eval.fid.paired=false",
                      f"eval.fid.cache_dir={args.work / 'fid_cache'}"]
    checkout = args.checkout.resolve()
    if not (checkout / "run.py").is_file():
        parser.error(f"--checkout {args.checkout} is not a checkout of this repository (no run.py)")
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short=8", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    common = {"checkout": commit, "template": args.template.name, "metrics": args.metrics, "bootstrap": args.bootstrap,
              "host": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    base = {stage: run_stage(stage, args.template, overrides, args.work / "report_base", checkout)
            for stage in args.stages if stage != "records"}
    grids = [tuple(int(x) for x in g.split("x")) for g in args.record_grids]
    runs = [(n, synthetic(args.template, args.work, n), None) for n in args.images]
    runs += [(n, synthetic(args.template, args.work, n, grid), grid) for grid in grids for n in args.grid_images]
    template_tokens = len(load_records(args.template)[0]["tokens"])
    for n, run_dir, grid in runs:
        tokens = template_tokens if grid is None else grid[0] * grid[1]
        for stage in args.stages:
            if grid is not None and stage == "report":
                continue
            got = (read_records(run_dir, checkout) if stage == "records"
                   else run_stage(stage, run_dir, overrides, run_dir / "report", checkout))
            if stage in base:
                got["above_base_mb"] = round(got["peak_mb"] - base[stage]["peak_mb"], 1)
                got["base_peak_mb"] = base[stage]["peak_mb"]
            line = common | {"stage": stage, "images": n, "tokens": tokens} | got
            print(json.dumps(line), flush=True)
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                with open(args.json, "a", encoding="utf-8") as f:
                    f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
