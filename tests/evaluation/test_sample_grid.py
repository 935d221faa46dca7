"""Sample grids caption every tile with its method and prompt (wrapped, truncated), so wrong images can be spotted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageFont

from csd.report.samples import CAPTION_LINES, caption_lines, captioned_grid
from csd.tracking import sample_grid
from experiments.make_sample_grid import sample_grid as run_grid
from tests.evaluation.test_eval_fixtures import make_run

LONG = "a red circle above a blue square on a striped background next to three small yellow triangles in a row " * 3


def test_caption_lines_wrap_and_truncate() -> None:
    font = ImageFont.load_default(size=11)
    lines = caption_lines(LONG, font, 150, CAPTION_LINES)
    assert len(lines) == CAPTION_LINES and lines[-1].endswith("…")
    assert all(font.getlength(line) <= 150 for line in lines)
    assert caption_lines("a red circle", font, 150, CAPTION_LINES) == ["a red circle"]
    assert all(font.getlength(line) <= 40 for line in caption_lines("supercalifragilistic word", font, 40, 2))


def tile_image(tmp_path: Path, value: int) -> Path:
    path = tmp_path / f"{value}.png"
    Image.fromarray(np.full((32, 32, 3), value, dtype=np.uint8)).save(path)
    return path


def test_every_tile_has_a_caption_under_it(tmp_path: Path) -> None:
    tiles = [(tile_image(tmp_path, 40 * i), f"method{i}", f"prompt {i}") for i in range(3)]
    grid = np.asarray(captioned_grid(tiles, ncols=2, tile=120))
    rows, tile_h = 2, 120
    cell_h = grid.shape[0] // rows
    assert grid.shape[1] >= 2 * 120 and cell_h > tile_h  # room for the caption under each tile
    for i in range(3):
        r, c = divmod(i, 2)
        caption = grid[r * cell_h + tile_h + 2:(r + 1) * cell_h - 2, c * grid.shape[1] // 2:(c + 1) * grid.shape[1] // 2]
        assert (caption < 128).any(), i  # dark text on the white caption strip


def test_wandb_grid_and_run_grid_are_captioned(tmp_path: Path) -> None:
    runs = [make_run(tmp_path / m, m, n_images=3) for m in ("ar", "sjd")]
    grid = run_grid(runs, n=3, tile=100)
    assert grid.height > 2 * 100 + 40 and grid.width >= 3 * 100  # two rows of captioned tiles
    paths = sorted((runs[0] / "images").glob("*.png"))
    plain_height = 32 * 2 + 2 * 3  # two rows of four 32-px tiles, torchvision padding
    assert sample_grid(paths, [("ar", f"caption {i}") for i in range(len(paths))]).shape[0] > plain_height
