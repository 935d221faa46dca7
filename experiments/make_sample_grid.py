"""Assemble a sample grid (rows: runs, columns: the same prompts) from finished run directories, every tile
captioned with its method and prompt (wrapped, truncated) so that an image that misses its prompt stands out.
Images without a PNG (the committed results have none) are decoded from their records' tokens (csd.decode).

    python -m experiments.make_sample_grid results/toy_paper/0_ar results/toy_paper/1_sjd results/toy_paper/9_csd \
        --n 8 --out results/toy_samples_ar_sjd_csd.png
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
from pathlib import Path

from PIL import Image

from csd.decode import RunImages
from csd.report.samples import TILE, captioned_grid


def sample_grid(run_dirs: list[Path], n: int, tile: int) -> Image.Image:
    """The first ``n`` images (by prompt id and sample; fewer if a run has fewer) of each run, one row per run,
    tiles ``tile`` pixels wide."""
    rows = [(json.loads((d / "run.json").read_text())["method"], RunImages(d)) for d in run_dirs]
    ncols = min(n, *(len(images) for _, images in rows))
    tiles = [(image, method, record["prompt"]) for method, images in rows
             for image, record in zip(images[:ncols], images.records[:ncols], strict=True)]
    return captioned_grid(tiles, ncols=ncols, tile=tile)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.make_sample_grid",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--n", type=int, default=8, help="prompts (columns)")
    parser.add_argument("--tile", type=int, default=TILE, help="tile width in pixels (small images are upscaled)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sample_grid(args.runs, args.n, args.tile).save(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
