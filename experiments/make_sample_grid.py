"""Assemble a sample grid (rows: runs, columns: the same prompts) from finished run directories.

    python experiments/make_sample_grid.py results/toy_paper/0_ar results/toy_paper/1_sjd results/toy_paper/5_csd \
        --n 8 --scale 3 --out results/toy_samples_ar_sjd_csd.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image, ImageDraw

from csd.records import load_records


def sample_grid(run_dirs: list[Path], n: int, scale: int) -> Image.Image:
    rows = []
    for run_dir in run_dirs:
        records = sorted(load_records(run_dir), key=lambda r: (r["prompt_id"], r["sample"]))[:n]
        rows.append((json.loads((run_dir / "run.json").read_text())["method"], [run_dir / r["image"] for r in records]))
    first = Image.open(rows[0][1][0])
    w, h = first.width * scale, first.height * scale
    label_w, pad = 70, 2
    grid = Image.new("RGB", (label_w + n * (w + pad), len(rows) * (h + pad)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (method, images) in enumerate(rows):
        y = i * (h + pad)
        draw.text((4, y + h // 2 - 5), method, fill="black")
        for j, path in enumerate(images):
            grid.paste(Image.open(path).convert("RGB").resize((w, h), Image.NEAREST), (label_w + j * (w + pad), y))
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--n", type=int, default=8, help="prompts (columns)")
    parser.add_argument("--scale", type=int, default=3, help="nearest-neighbour upscaling of each image")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sample_grid(args.runs, args.n, args.scale).save(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
