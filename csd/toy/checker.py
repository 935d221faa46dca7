"""Exact scene checker for the toy domain (GenEval-style: object, colour, count, position).

Works from pixels alone: a pixel belongs to an object colour when it is within
:data:`COLOUR_RADIUS` of that palette colour (backgrounds only use neutral tones, far from all of
them); 4-connected components of at least :data:`MIN_AREA` pixels are objects; an object's shape
follows from how much of its bounding box it fills (square ~1, disc ~pi/4, triangle ~1/2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import ndimage

from csd.toy.domain import COLOURS, SceneSpec, as_spec

COLOUR_RADIUS = 90.0
MIN_AREA = 12
#: fill-ratio thresholds: below the first a triangle, below the second a circle, else a square
TRIANGLE_MAX_FILL, CIRCLE_MAX_FILL = 0.64, 0.9
#: how far apart (px) the two groups' mean centres must be along the relation's axis
POSITION_MARGIN = 2.0
_PALETTE = np.array(list(COLOURS.values()), dtype=np.float64)
_COLOUR_NAMES = list(COLOURS)


@dataclass(frozen=True)
class DetectedObject:
    colour: str
    shape: str
    area: int
    centre: tuple[float, float]  # (x, y) in pixels


def _components(image: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, str]]]:
    """Palette-colour index map and the object-sized components as (mask, colour)."""
    dist = np.linalg.norm(image.astype(np.float64)[:, :, None, :] - _PALETTE, axis=-1)
    colour_map = np.where(dist.min(-1) < COLOUR_RADIUS, dist.argmin(-1), -1)
    found = []
    for ci, name in enumerate(_COLOUR_NAMES):
        labels, n = ndimage.label(colour_map == ci)
        for k in range(1, n + 1):
            mask = labels == k
            if mask.sum() >= MIN_AREA:
                found.append((mask, name))
    found.sort(key=lambda item: tuple(np.argwhere(item[0])[0]))  # raster order of the first pixel
    return colour_map, found


def _shape(mask: np.ndarray) -> str:
    ys, xs = np.nonzero(mask)
    fill = mask.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    if fill < TRIANGLE_MAX_FILL:
        return "triangle"
    return "circle" if fill < CIRCLE_MAX_FILL else "square"


def detect(image: np.ndarray) -> list[DetectedObject]:
    """Objects visible in a uint8 ``[H, W, 3]`` image, in raster order."""
    objects = []
    for mask, colour in _components(image)[1]:
        ys, xs = np.nonzero(mask)
        objects.append(DetectedObject(colour, _shape(mask), int(mask.sum()), (xs.mean() + 0.5, ys.mean() + 0.5)))
    return objects


def segment(image: np.ndarray) -> np.ndarray:
    """Label map ``[H, W]``: 0 = background, k = the k-th detected object (raster order, as :func:`detect`)."""
    labels = np.zeros(image.shape[:2], dtype=np.int64)
    for k, (mask, _) in enumerate(_components(image)[1], start=1):
        labels[mask] = k
    return labels


def background_kind(scene_or_caption: SceneSpec | str | dict[str, Any]) -> str:
    """``"smooth"`` (plain, gradient) or ``"textured"`` (striped, checkered, noisy)."""
    return as_spec(scene_or_caption).background_kind


def _position_ok(spec: SceneSpec, objects: list[DetectedObject]) -> bool:
    members = [[o for o in objects if (o.colour, o.shape) == (g.colour, g.shape)] for g in spec.groups]
    if not all(members):
        return False
    axis = 0 if spec.relation in ("left of", "right of") else 1
    first, second = (float(np.mean([o.centre[axis] for o in m])) for m in members)
    if spec.relation in ("left of", "above"):
        return first + POSITION_MARGIN <= second
    return first >= second + POSITION_MARGIN


def check_image(image: np.ndarray, scene_or_caption: SceneSpec | str | dict[str, Any]) -> dict[str, Any]:
    """Does a uint8 ``[H, W, 3]`` image show what the caption / scene spec asks for?

    Returns booleans ``object`` (every asked shape present), ``colour`` (every asked colour present),
    ``count`` (exact count of every asked colour+shape and no other objects), ``position`` (the
    relation holds between the groups' mean centres; vacuously true without a relation) and
    ``overall`` (all of them), plus ``relation_asked`` and ``n_detected``.
    """
    spec = as_spec(scene_or_caption)
    objects = detect(image)
    shapes = {o.shape for o in objects}
    colours = {o.colour for o in objects}
    result: dict[str, Any] = {
        "object": all(g.shape in shapes for g in spec.groups),
        "colour": all(g.colour in colours for g in spec.groups),
        "count": len(objects) == spec.n_objects and all(
            sum((o.colour, o.shape) == (g.colour, g.shape) for o in objects) == g.count for g in spec.groups
        ),
        "position": spec.relation is None or _position_ok(spec, objects),
    }
    result["overall"] = all(result.values())
    result["relation_asked"] = spec.relation is not None
    result["n_detected"] = len(objects)
    return result
