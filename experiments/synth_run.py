"""A synthetic run directory of any size, for measuring how the stages after generation scale (docs/PERFORMANCE.md,
"Scale": evaluation, report and records at 1k-30k images).

It copies a real run directory made by the pipeline (``--template``: its ``config.yaml`` and ``run.json``, e.g. a
one-image rehearsal run, docs/MODELS.md "Rehearsal") and writes ``--images`` records and PNGs in the exact format the
generate stage writes (:class:`csd.records.ImageRecord`, one JSON line each; PIL's PNG encoder, as
:func:`csd.records.png_bytes`). Each record keeps the template record's model, method, grid, meta and token count
(``--grid ROWS COLS`` sets another grid, its ``ROWS x COLS`` tokens every one free: records alone, e.g. 96 x 97 for
the ~9,300 tokens of the newest models at 768 px), with seeded values where generation would put its own:

- ``tokens``: uniform over the model's vocabulary (``run.json``'s ``model_info.vocab_size``);
- ``commit_iter``: iterations that commit runs of 1-8 tokens (a speculative run's shape), ``commit_kind``: sampled or
  accepted, ``entropy``: uniform over ``[0, 8)`` nats rounded to 4 decimals, as the engine records it;
- counters and times consistent with those (``nfe`` = iterations, ``step_compression`` = tokens / nfe);
- the image: the template PNG's size, one flat colour per token's patch (the grid upscaled) with a per-image gradient,
  so the PNG decodes at the real pixel count (a decoded photo's PNG is larger on disk: its bytes are not the
  measure here).

``--reference DIR --reference-images M`` also writes ``M`` images of the same kind into ``DIR``, as an FID reference
set (``eval.fid.reference_dir=DIR eval.fid.paired=false``). Writing is in bulk (no fsync per line): a synthetic run is
made once and then only read.

    python -m experiments.synth_run --template /tmp/tmpl/janus_384 --out /tmp/scale/n1000 --images 1000
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from csd.decode import RunImages
from csd.records import (
    COMMIT_ACCEPTED,
    COMMIT_SAMPLED,
    RECORDS_FILE,
    ImageRecord,
    image_name,
    load_records,
    png_bytes,
)

CAPTIONS = ("A man riding a wave on top of a surfboard.", "Two dogs playing with a red frisbee in a park.",
            "A kitchen with a white refrigerator and wooden cabinets.", "A red double decker bus on a city street.")
#: longest run of tokens one synthetic iteration commits
MAX_RUN = 8


def commit_fields(rng: np.random.Generator, length: int) -> tuple[list[int], list[int], list[float], int]:
    """``commit_iter``, ``commit_kind``, ``entropy`` of ``length`` positions and the iteration count: each iteration
    commits a run of 1 .. :data:`MAX_RUN` tokens, the first sampled and the rest accepted."""
    runs = rng.integers(1, MAX_RUN + 1, size=length)
    ends = np.cumsum(runs)
    runs = runs[: int(np.searchsorted(ends, length)) + 1]
    runs[-1] -= int(runs.sum()) - length
    iters = np.repeat(np.arange(len(runs)), runs)
    starts = np.concatenate([[0], np.cumsum(runs)[:-1]])
    kinds = np.full(length, COMMIT_ACCEPTED)
    kinds[starts] = COMMIT_SAMPLED
    entropy = np.round(rng.uniform(0.0, 8.0, size=length), 4)
    return iters.tolist(), kinds.tolist(), entropy.tolist(), len(runs)


def synth_image(rng: np.random.Generator, grid: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """A ``[H, W, 3]`` uint8 image of ``size`` (width, height): a flat colour per grid cell plus a gradient."""
    cells = rng.integers(0, 256, size=(*grid, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(cells).resize(size, Image.NEAREST), dtype=np.int16)
    ramp = np.linspace(-24, 24, size[0], dtype=np.float32)[None, :, None]
    return np.clip(image + ramp.round().astype(np.int16), 0, 255).astype(np.uint8)


def synth_record(template: dict[str, Any], index: int, rng: np.random.Generator, vocab: int,
                 length: int) -> ImageRecord:
    """Record ``index`` of the synthetic run: the template's model, method and grid, seeded values elsewhere."""
    iters, kinds, entropy, n_iter = commit_fields(rng, length)
    prompt_id = f"synth-{index:06d}"
    accepted = length - n_iter
    return ImageRecord(
        prompt_id=prompt_id, prompt=CAPTIONS[index % len(CAPTIONS)], sample=0, seed=index,
        method=template["method"], method_params=template["method_params"], model=template["model"],
        image=image_name(prompt_id, 0), tokens=rng.integers(0, vocab, size=length).tolist(), grid=template["grid"],
        nfe=n_iter, iterations=n_iter, step_compression=length / n_iter, drafts_proposed=accepted + n_iter,
        drafts_verified=accepted + n_iter, drafts_accepted=accepted, relaxed_accepts=0, filter_checks=0,
        filter_passes=0, prefill_s=0.02, decode_s=0.001 * n_iter, vq_decode_s=0.05, latency_s=0.07 + 0.001 * n_iter,
        commit_iter=iters, commit_kind=kinds, entropy=entropy, meta=template["meta"],
        batch_size=template.get("batch_size", 1),
    )


def image_size(template_dir: Path, record: dict[str, Any]) -> tuple[int, int]:
    """(width, height) of the template record's image: its PNG's, or (a committed run keeps no PNGs) its tokens decoded
    by the run's model (:class:`csd.decode.RunImages`)."""
    height, width, _ = RunImages(template_dir, [record]).array(record).shape
    return width, height


def write_run(template_dir: Path, out: Path, n_images: int, grid: tuple[int, int] | None = None, images: bool = True,
              seed: int = 0) -> Path:
    """``out``: the template's config and run.json (``n_images`` = ``n_images``), ``n_images`` synthetic records (on
    ``grid``, default the template's) and, unless ``images`` is false, their PNGs at the template image's size."""
    template = load_records(template_dir)[0]
    size = image_size(template_dir, template) if images else (0, 0)
    if grid is not None:
        template = template | {"grid": list(grid), "tokens": [0] * (grid[0] * grid[1])}
    info = json.loads((template_dir / "run.json").read_text())
    vocab = info["model_info"]["vocab_size"]
    length = len(template["tokens"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "images").mkdir(exist_ok=True)
    shutil.copy(template_dir / "config.yaml", out / "config.yaml")
    if grid is not None:  # the model these records describe: another grid and body length, all of it free
        info = info | {"model_info": info["model_info"] | {"grid": list(grid), "body_length": length}}
    (out / "run.json").write_text(json.dumps(info | {"n_images": n_images}, indent=2), encoding="utf-8")
    rng = np.random.default_rng(seed)
    grid = tuple(template["grid"])
    with open(out / RECORDS_FILE, "w", encoding="utf-8") as f:
        for i in range(n_images):
            record = synth_record(template, i, rng, vocab, length)
            if images:
                (out / record.image).write_bytes(png_bytes(synth_image(rng, grid, size)))
            f.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
    return out


def write_reference(template_dir: Path, out: Path, n_images: int, seed: int = 1) -> Path:
    """``n_images`` reference PNGs of the synthetic kind, at the template image's size."""
    template = load_records(template_dir)[0]
    size = image_size(template_dir, template)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n_images):
        (out / f"ref-{i:06d}.png").write_bytes(png_bytes(synth_image(rng, tuple(template["grid"]), size)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.synth_run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", type=Path, required=True, help="a run directory made by the pipeline")
    parser.add_argument("--out", type=Path, required=True, help="the synthetic run directory to write")
    parser.add_argument("--images", type=int, required=True, help="records (and PNGs) to write")
    parser.add_argument("--grid", type=int, nargs=2, default=None, metavar=("ROWS", "COLS"),
                        help="the records' token grid (default: the template's); records only")
    parser.add_argument("--reference", type=Path, default=None, help="also write an FID reference set here")
    parser.add_argument("--reference-images", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error(f"--images {args.images}: give at least 1")
    write_run(args.template, args.out, args.images, args.grid, args.grid is None, args.seed)
    if args.reference is not None:
        write_reference(args.template, args.reference, args.reference_images, args.seed + 1)
    print(f"{args.out}: {args.images} synthetic records" + (" and images" if args.grid is None else ""))


if __name__ == "__main__":
    main()
