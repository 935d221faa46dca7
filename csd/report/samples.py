"""Sample grids with a caption under every tile (method, then the prompt wrapped and truncated), so that an image
that does not match its prompt can be spotted (experiments/make_sample_grid.py, the W&B ``samples`` grid)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from csd.evaluation.images import load_rgb

#: tile width in pixels: small images (the toy's 32 x 32) are upscaled, nearest neighbour, so the caption fits
TILE = 160
#: prompt lines under a tile (below the method's line); longer prompts end in "…"
CAPTION_LINES = 3
FONT_SIZE = 11
PAD = 4
ELLIPSIS = "…"


def caption_lines(text: str, font: ImageFont.ImageFont, width: float, max_lines: int) -> list[str]:
    """``text`` wrapped at word boundaries into lines of at most ``width`` pixels, at most ``max_lines`` of them,
    the last ending in :data:`ELLIPSIS` when text is left out (a word wider than a line is cut)."""
    lines: list[str] = []
    for word in text.split():
        trial = f"{lines[-1]} {word}" if lines else word
        if lines and font.getlength(trial) <= width:
            lines[-1] = trial
        else:
            lines.append(word)
    cut = len(lines) > max_lines
    lines = lines[:max_lines]
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        suffix = ELLIPSIS if (last and cut) or font.getlength(line) > width else ""
        while line and font.getlength(line + suffix) > width:
            line = line[:-1]
        lines[i] = line + suffix
    return lines


def captioned_grid(tiles: Sequence[tuple[Path | Image.Image, str, str]], ncols: int, tile: int = TILE) -> Image.Image:
    """``(image, method, prompt)`` tiles in rows of ``ncols``, each ``tile`` pixels wide (height by the image's
    aspect) with its method and prompt under it, on white. An image is a file or in memory (a run's images:
    csd.decode.RunImages, which decodes those without a PNG)."""
    font = ImageFont.load_default(size=FONT_SIZE)
    first = load_rgb(tiles[0][0])
    tile_h = round(tile * first.height / first.width)
    line_h = FONT_SIZE + 3
    cell_w, cell_h = tile + PAD, tile_h + PAD + line_h * (1 + CAPTION_LINES) + PAD
    rows = -(-len(tiles) // ncols)
    grid = Image.new("RGB", (ncols * cell_w, rows * cell_h), "white")
    draw = ImageDraw.Draw(grid)
    for i, (source, method, prompt) in enumerate(tiles):
        x, y = (i % ncols) * cell_w, (i // ncols) * cell_h
        image = load_rgb(source)
        resample = Image.NEAREST if image.width < tile else Image.LANCZOS
        grid.paste(image.resize((tile, tile_h), resample), (x, y))
        text_y = y + tile_h + PAD
        draw.text((x, text_y), caption_lines(method, font, tile, 1)[0], fill="black", font=font)
        for k, line in enumerate(caption_lines(prompt, font, tile, CAPTION_LINES)):
            draw.text((x, text_y + (k + 1) * line_h), line, fill=(70, 70, 70), font=font)
    return grid
