"""The toy text-to-image domain: coloured shapes on smooth or textured backgrounds, with captions.

A :class:`SceneSpec` is the *meaning* of a caption (object groups, an optional spatial relation, the
background pattern); :func:`render_scene` draws one random layout of it at 32x32 px and returns the
ground-truth per-pixel object map too. Everything is deterministic given a ``numpy`` generator, so
the training stream (:func:`training_stream`) and the held-out prompts (:func:`heldout_prompts`) are
reproducible.

Three styles share captions, objects and the scene checker: ``clean`` (the embedded toy's), ``textured``
(``model=toy_textured``), whose background cells are each drawn at random from the tokenizer's neutral patch
codes around the clean pattern (:func:`texture_law`): free where the caption leaves the image free, decided
where it asks for an object; and ``textured_outline``, the textured style whose objects' outlines are jittered
too (:func:`_outline`; a candidate for the textured toy, csd/toy/MODEL_CARD.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import ndimage

from csd.errors import ConfigError
from csd.prompts import Prompt

IMAGE_SIZE = 32
SHAPES = ("circle", "square", "triangle")
#: saturated object colours; backgrounds use only the neutral tones below, so colour alone separates them
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 205, 40),
}
BACKGROUND_TONES: tuple[tuple[int, int, int], ...] = (
    (236, 236, 232),
    (196, 196, 196),
    (150, 150, 150),
    (96, 96, 100),
    (200, 180, 150),
    (120, 104, 88),
)
#: tone pairs (indices into BACKGROUND_TONES) used by gradients and textures; all have visible contrast
TONE_PAIRS = ((0, 2), (1, 3), (0, 4), (4, 5), (2, 3), (0, 3))
SMOOTH_BACKGROUNDS = ("plain", "gradient")
TEXTURED_BACKGROUNDS = ("striped", "checkered", "noisy")
BACKGROUNDS = SMOOTH_BACKGROUNDS + TEXTURED_BACKGROUNDS
RELATIONS = ("left of", "right of", "above", "below")
COUNT_WORDS = {1: "a", 2: "two", 3: "three"}
MIN_SIZE, MAX_SIZE = 9, 12
#: empty pixels kept between object bounding boxes (so equal-coloured objects never touch)
GAP = 2
#: minimum separation (px) of group centroids along the relation's axis
RELATION_MARGIN = 4
#: probabilities of the four caption kinds: one object, one counted group, two related groups, two groups
#: joined by "and" (the held-out prompts use these; training may reweight them, ``experiments/train_toy.py``)
SCENE_KIND_PROBS = (0.3, 0.25, 0.35, 0.1)
HELDOUT_SEED = 20260611
STYLES = ("clean", "textured", "textured_outline")
#: probability that a pixel of an object's outline band flips between object and background (``textured_outline``)
OUTLINE_FLIP = 0.5
#: Boltzmann temperature (grey levels, RMS over a 2x2 patch) of the textured style's background cells, per
#: background: noise and checks take the most (toy-CLIP keeps reading them as such), plain the least; chosen for a
#: mean cell entropy near 0.3 of log V at the smallest loss of toy-CLIP score (docs/RESULTS.md, "A second toy")
TEXTURE_TEMPERATURE = {"plain": 7.0, "gradient": 9.0, "striped": 8.0, "checkered": 14.0, "noisy": 40.0}
#: a codebook entry is a neutral (background) pattern when every pixel's channels differ by less than this ...
NEUTRAL_SATURATION = 40.0
#: ... and every pixel lies this far (RGB distance) from every object colour
NEUTRAL_DISTANCE = 100.0
#: prompts of a toy split (ids of four digits: toy-0000 .. toy-9999); a scene is drawn per index, so any count could
#: be built, but ten thousand already take about a second and more would only repeat the finite caption space
SPLIT_SIZE = 10_000
TRAIN_SEED = 7


@dataclass(frozen=True)
class ObjectGroup:
    """``count`` identical-looking objects of one colour and shape."""

    colour: str
    shape: str
    count: int

    def phrase(self) -> str:
        noun = self.shape if self.count == 1 else self.shape + "s"
        return f"{COUNT_WORDS[self.count]} {self.colour} {noun}"


@dataclass(frozen=True)
class SceneSpec:
    """What a caption asks for. With two groups, ``relation`` (or None for "and") relates group 0 to group 1."""

    groups: tuple[ObjectGroup, ...]
    relation: str | None
    background: str

    @property
    def n_objects(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def background_kind(self) -> str:
        return "smooth" if self.background in SMOOTH_BACKGROUNDS else "textured"

    def caption(self) -> str:
        if len(self.groups) == 1:
            objects = self.groups[0].phrase()
        else:
            link = self.relation if self.relation is not None else "and"
            objects = f"{self.groups[0].phrase()} {link} {self.groups[1].phrase()}"
        return f"{objects} on a {self.background} background"

    def to_meta(self) -> dict[str, Any]:
        """Plain JSON-able form (stored in :attr:`Prompt.meta`)."""
        return {
            "groups": [{"colour": g.colour, "shape": g.shape, "count": g.count} for g in self.groups],
            "relation": self.relation,
            "background": self.background,
            "background_kind": self.background_kind,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> SceneSpec:
        groups = tuple(ObjectGroup(g["colour"], g["shape"], int(g["count"])) for g in meta["groups"])
        return cls(groups, meta.get("relation"), meta["background"])


def parse_caption(text: str) -> SceneSpec:
    """Invert :meth:`SceneSpec.caption` (raises ``ValueError`` on text outside the grammar)."""
    words = text.strip().split()
    if len(words) < 4 or words[-4:-2] != ["on", "a"] or words[-1] != "background":
        raise ValueError(f"not a toy caption: {text!r}")
    background = words[-2]
    body = words[:-4]
    counts = {w: n for n, w in COUNT_WORDS.items()}

    def group(ws: list[str]) -> ObjectGroup:
        if len(ws) != 3 or ws[0] not in counts or ws[1] not in COLOURS:
            raise ValueError(f"not a toy object phrase: {' '.join(ws)!r}")
        count = counts[ws[0]]
        shape = ws[2] if count == 1 else ws[2].removesuffix("s")
        if shape not in SHAPES:
            raise ValueError(f"unknown shape in {text!r}")
        return ObjectGroup(ws[1], shape, count)

    if len(body) == 3:
        groups, relation = (group(body),), None
    else:
        link = " ".join(body[3:-3])
        if link != "and" and link not in RELATIONS:
            raise ValueError(f"unknown relation {link!r} in {text!r}")
        groups, relation = (group(body[:3]), group(body[-3:])), (None if link == "and" else link)
    if background not in BACKGROUNDS:
        raise ValueError(f"unknown background {background!r}")
    return SceneSpec(groups, relation, background)


def as_spec(scene_or_caption: SceneSpec | str | dict[str, Any]) -> SceneSpec:
    """Accept a spec, a caption or a prompt's ``meta`` dict."""
    if isinstance(scene_or_caption, SceneSpec):
        return scene_or_caption
    if isinstance(scene_or_caption, str):
        return parse_caption(scene_or_caption)
    return SceneSpec.from_meta(scene_or_caption)


def sample_spec(rng: np.random.Generator, kind_probs: tuple[float, ...] = SCENE_KIND_PROBS) -> SceneSpec:
    """Draw a caption meaning: single objects, counting, two related groups, or two groups joined by "and"
    (with probabilities ``kind_probs``)."""
    background = BACKGROUNDS[rng.integers(len(BACKGROUNDS))]

    def random_group(count: int) -> ObjectGroup:
        return ObjectGroup(list(COLOURS)[rng.integers(len(COLOURS))], SHAPES[rng.integers(len(SHAPES))], count)

    kind = rng.choice(4, p=kind_probs)
    if kind == 0:
        return SceneSpec((random_group(1),), None, background)
    if kind == 1:
        return SceneSpec((random_group(int(rng.integers(2, 4))),), None, background)
    counts = (1, 1) if kind == 3 else [(1, 1), (1, 1), (2, 1), (1, 2)][rng.integers(4)]
    first = random_group(counts[0])
    second = random_group(counts[1])
    while (second.colour, second.shape) == (first.colour, first.shape):
        second = random_group(counts[1])
    relation = None if kind == 3 else RELATIONS[rng.integers(len(RELATIONS))]
    return SceneSpec((first, second), relation, background)


def _background(name: str, rng: np.random.Generator) -> np.ndarray:
    size = IMAGE_SIZE
    tones = np.array(BACKGROUND_TONES, dtype=np.float64)
    pair = TONE_PAIRS[rng.integers(len(TONE_PAIRS))]
    a, b = tones[list(pair)] if rng.random() < 0.5 else tones[list(pair[::-1])]
    yy, xx = np.mgrid[0:size, 0:size]
    if name == "plain":
        return np.broadcast_to(tones[rng.integers(len(tones))], (size, size, 3)).copy()
    if name == "gradient":
        t = (yy if rng.random() < 0.5 else xx) / (size - 1)
        return a + (b - a) * t[..., None]
    if name == "striped":
        coord = yy if rng.random() < 0.5 else xx
        mask = ((coord + rng.integers(4)) // 2) % 2 == 0
    elif name == "checkered":
        mask = (((yy + rng.integers(8)) // 4 + (xx + rng.integers(8)) // 4) % 2) == 0
    else:  # 2x2-pixel noise blocks on the tokenizer's patch grid: high token entropy, exact reconstruction
        mask = np.kron(rng.random((size // 2, size // 2)) < 0.5, np.ones((2, 2), dtype=bool))
    return np.where(mask[..., None], a, b)


@lru_cache(maxsize=1)
def neutral_patterns() -> np.ndarray:
    """The shipped tokenizer's neutral patch codes as ``[n, 12]`` float patterns (2x2 pixels x RGB, raster order):
    the cells a textured background is drawn from, so its background cells encode exactly (29 of 256 codes)."""
    from csd.toy import TOKENIZER_FILE
    from csd.toy.tokenizer import PatchTokenizer

    centroids = PatchTokenizer.load(TOKENIZER_FILE).centroids.numpy().astype(np.float64)
    pixels = centroids.reshape(len(centroids), -1, 3)
    palette = np.array(list(COLOURS.values()), dtype=np.float64)
    saturation = (pixels.max(-1) - pixels.min(-1)).max(-1)
    distance = np.linalg.norm(pixels[:, :, None, :] - palette, axis=-1).min((1, 2))
    return centroids[(saturation < NEUTRAL_SATURATION) & (distance > NEUTRAL_DISTANCE)]


def _cells(image: np.ndarray) -> np.ndarray:
    """``[32, 32, C]`` -> ``[256, 4 C]``: the 2x2 patches of the tokenizer's grid, raster order."""
    g = IMAGE_SIZE // 2
    return image.reshape(g, 2, g, 2, -1).transpose(0, 2, 1, 3, 4).reshape(g * g, -1)


def _uncells(cells: np.ndarray) -> np.ndarray:
    g = IMAGE_SIZE // 2
    return cells.reshape(g, g, 2, 2, 3).transpose(0, 2, 1, 3, 4).reshape(IMAGE_SIZE, IMAGE_SIZE, 3)


def texture_law(clean: np.ndarray, background: str) -> np.ndarray:
    """The textured style's law of each background cell given the clean background ``[32, 32, 3]``: ``[256, n]``
    probabilities over :func:`neutral_patterns`, ``p(g | cell) ∝ exp(-RMS(g - cell) / T)`` with ``T =
    TEXTURE_TEMPERATURE[background]`` (RMS over the cell's 12 values)."""
    patterns = neutral_patterns()
    rms = np.sqrt(((_cells(clean)[:, None, :] - patterns[None]) ** 2).mean(-1))
    logits = -rms / TEXTURE_TEMPERATURE[background]
    weights = np.exp(logits - logits.max(1, keepdims=True))
    return weights / weights.sum(1, keepdims=True)


def _texture(clean: np.ndarray, background: str, rng: np.random.Generator) -> np.ndarray:
    """One draw of every cell from :func:`texture_law` (inverse CDF, one uniform per cell)."""
    law = texture_law(clean, background)
    index = np.minimum((law.cumsum(1) < rng.random((len(law), 1))).sum(1), law.shape[1] - 1)
    return _uncells(neutral_patterns()[index])


def _shape_mask(shape: str, x: int, y: int, s: int) -> np.ndarray:
    """Pixels whose centres fall inside the shape drawn in the box ``[x, x+s) x [y, y+s)``."""
    py, px = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] + 0.5
    inside_box = (px >= x) & (px < x + s) & (py >= y) & (py < y + s)
    if shape == "square":
        return inside_box
    cx = x + s / 2
    if shape == "circle":
        return (px - cx) ** 2 + (py - (y + s / 2)) ** 2 <= (s / 2) ** 2
    return inside_box & (np.abs(px - cx) <= (py - y) / 2)


def _outline(mask: np.ndarray, x: int, y: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """The ``textured_outline`` style's object ``mask`` with a jittered outline: each pixel of its one-pixel band (the
    4-neighbour dilation minus the erosion) that lies strictly inside the box ``[x, x+s) x [y, y+s)`` flips between
    object and background with probability :data:`OUTLINE_FLIP` (one uniform per band pixel, raster order). The box's
    own rows and columns never flip, so the shape keeps every pixel it has on its box's edge (a circle's four sides,
    a triangle's base and sides: its extent, which the checker's fill ratio divides by, moves only where an
    even-sized triangle's apex row lies inside the box), and a square, whose band lies on or outside its box, stays
    exact."""
    cross = ndimage.generate_binary_structure(2, 1)
    band = ndimage.binary_dilation(mask, cross) & ~ndimage.binary_erosion(mask, cross)
    inner = np.zeros_like(mask)
    inner[y + 1:y + s - 1, x + 1:x + s - 1] = True
    band &= inner
    flip = np.zeros_like(mask)
    flip[band] = rng.random(int(band.sum())) < OUTLINE_FLIP
    return mask ^ flip


def _place(spec: SceneSpec, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """Random non-touching boxes ``(x, y, size)``, one per object, satisfying the relation."""
    group_of = [gi for gi, g in enumerate(spec.groups) for _ in range(g.count)]
    for attempt in range(2000):
        top = MAX_SIZE - attempt // 500
        boxes: list[tuple[int, int, int]] = []
        for _ in group_of:
            s = int(rng.integers(MIN_SIZE, top + 1))
            x, y = (int(v) for v in rng.integers(1, IMAGE_SIZE - s, size=2))
            if all(x + s + GAP <= bx or bx + bs + GAP <= x or y + s + GAP <= by or by + bs + GAP <= y
                   for bx, by, bs in boxes):
                boxes.append((x, y, s))
            else:
                break
        if len(boxes) == len(group_of) and _relation_holds(spec.relation, boxes, group_of, RELATION_MARGIN):
            return boxes
    raise RuntimeError(f"could not place {spec.caption()!r}")


def _relation_holds(relation: str | None, boxes: list[tuple[int, int, int]], group_of: list[int],
                    margin: float) -> bool:
    if relation is None:
        return True
    axis = 0 if relation in ("left of", "right of") else 1
    centres = [(b[axis] + b[2] / 2) for b in boxes]
    first = [c for c, g in zip(centres, group_of, strict=True) if g == 0]
    second = [c for c, g in zip(centres, group_of, strict=True) if g == 1]
    if relation in ("left of", "above"):
        return max(first) + margin <= min(second)
    return min(first) >= max(second) + margin


def render_scene(spec: SceneSpec, rng: np.random.Generator, style: str = "clean") -> tuple[np.ndarray, np.ndarray]:
    """Draw one layout of ``spec`` in ``style`` (:data:`STYLES`): uint8 image ``[32, 32, 3]`` and layout ``[32, 32]``
    (0 = background, k = object k)."""
    if style not in STYLES:
        raise ValueError(f"style={style!r}: the toy domain has styles {', '.join(STYLES)}")
    image = _background(spec.background, rng)
    if style != "clean":
        image = _texture(image, spec.background, rng)
    layout = np.zeros((IMAGE_SIZE, IMAGE_SIZE), dtype=np.int64)
    objects = [g for g in spec.groups for _ in range(g.count)]
    for k, (group, (x, y, s)) in enumerate(zip(objects, _place(spec, rng), strict=True), start=1):
        mask = _shape_mask(group.shape, x, y, s)
        if style == "textured_outline":
            mask = _outline(mask, x, y, s, rng)
        image[mask] = COLOURS[group.colour]
        layout[mask] = k
    return np.clip(np.round(image), 0, 255).astype(np.uint8), layout


def render_batch(specs: list[SceneSpec], rng: np.random.Generator, style: str = "clean") -> np.ndarray:
    """Images ``[B, 32, 32, 3]`` uint8 of ``specs`` (one random layout each)."""
    return np.stack([render_scene(s, rng, style)[0] for s in specs])


def training_stream(seed: int = TRAIN_SEED, batch_size: int = 32, kind_probs: tuple[float, ...] = SCENE_KIND_PROBS,
                    style: str = "clean") -> Iterator[tuple[list[SceneSpec], np.ndarray]]:
    """Endless batches ``(specs, images)`` of fresh random scenes (caption kinds drawn with ``kind_probs``)."""
    rng = np.random.default_rng([seed, 0])
    while True:
        specs = [sample_spec(rng, kind_probs) for _ in range(batch_size)]
        yield specs, render_batch(specs, rng, style)


def _split_prompts(n: int, seed: int, prefix: str) -> list[Prompt]:
    prompts = []
    for i in range(n):
        spec = sample_spec(np.random.default_rng([seed, i]))
        prompts.append(Prompt(f"{prefix}-{i:04d}", spec.caption(), {**spec.to_meta(), "render_seed": [seed, i]}))
    return prompts


def heldout_prompts(n: int = 256) -> list[Prompt]:
    """The fixed evaluation prompts ``toy-0000 ...`` (scene spec in ``meta``; same for every ``n`` prefix)."""
    return _split_prompts(n, HELDOUT_SEED, "toy")


def heldout_scene(prompt: Prompt, style: str = "clean") -> tuple[np.ndarray, np.ndarray]:
    """The reference rendering (image, layout) of a held-out prompt."""
    return render_scene(SceneSpec.from_meta(prompt.meta), np.random.default_rng(prompt.meta["render_seed"]), style)


def heldout_scene_textured(prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
    """:func:`heldout_scene` in the textured style: ``model=toy_textured``'s FID reference (``eval.toy.render``)."""
    return heldout_scene(prompt, "textured")


def heldout_scene_textured_outline(prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
    """:func:`heldout_scene` in the ``textured_outline`` style: the outline candidate's FID reference
    (``model.reference_render``)."""
    return heldout_scene(prompt, "textured_outline")


def toy_prompts(n_prompts: int | None = None, split: str = "heldout") -> list[Prompt]:
    """Hydra dataset loader: ``split="heldout"`` (evaluation, default 256 prompts) or ``"train"``, each
    :data:`SPLIT_SIZE` prompts at most (refused before any is built)."""
    n = 256 if n_prompts is None else n_prompts
    if n > SPLIT_SIZE:
        raise ConfigError(f"dataset.n_prompts={n}, but dataset=toy has {SPLIT_SIZE} prompts per split (ids "
                          f"toy-0000 .. toy-{SPLIT_SIZE - 1}); set dataset.n_prompts <= {SPLIT_SIZE}")
    if split == "heldout":
        return heldout_prompts(n)
    if split == "train":
        return _split_prompts(n, TRAIN_SEED, "toy-train")
    raise ValueError(f"unknown toy split {split!r} (expected 'heldout' or 'train')")
