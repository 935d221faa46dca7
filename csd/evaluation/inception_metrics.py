"""Inception score and k-NN precision / recall on Inception-v3 features (docs/EVALUATION.md, "Inception score",
"Precision and recall").

- **Inception score** (Salimans et al. 2016, arXiv 1606.03498): ``IS = exp(E_x KL(p(y|x) || p(y)))`` with
  ``p(y)`` the mean of ``p(y|x)`` over the images; as published, the images are cut into ``splits`` parts (10) and
  the mean and standard deviation of the parts' scores are reported. With ``H`` the entropy,
  ``E_x KL(p(y|x) || p(y)) = H(p(y)) - E_x H(p(y|x))``, so a part's score needs only its marginal and mean entropy.
- **Precision / recall** (Kynkäänniemi et al. 2019, arXiv 1904.06991): each set's manifold is the union of balls
  around its feature vectors, of radius the distance to the ``k``-th nearest neighbour inside the set (k = 3);
  precision = the fraction of generated images inside the reference manifold, recall = the fraction of reference
  images inside the generated one.

The Inception score's network is torch-fidelity's Inception-v3 (torchmetrics' ``NoTrainInceptionV3``, the FID
network), its 1008 ``logits_unbiased`` for the class law. The manifolds are built on that network's 2048 pool
features (``features: inception``, as ADM's evaluator) or on VGG-16's fc2 features (``features: vgg16``, the
improved precision / recall code LANTERN releases: :func:`vgg16_network`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from urllib.error import URLError

import numpy as np
import torch
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.images import Preprocess, file_batches
from csd.evaluation.intervals import SEED, Resamples, percentile_interval

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
#: torchvision's ImageNet VGG-16 (``VGG16_Weights.IMAGENET1K_V1``, what ``vgg16(pretrained=True)`` loads)
VGG16_FILE = "vgg16-397923af.pth"
VGG16_FETCH = f"wget https://download.pytorch.org/models/{VGG16_FILE}"
#: the ImageNet normalisation of torchvision's ``transforms.Normalize`` in front of VGG-16
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: features of one uint8 ``[B, 3, H, W]`` batch -> ``[B, D]``
Features = Callable[[torch.Tensor], torch.Tensor]


def inception_network(output: str, weights: str | None, key: str) -> nn.Module:
    """torch-fidelity's Inception-v3 returning ``output`` (``logits_unbiased`` or ``2048``); ``weights``: the local
    weights file (``key``), null for the torch hub cache. A missing file is one line, before anything loads."""
    if weights is not None and not Path(weights).expanduser().is_file():
        raise missing_file("Inception", weights, key)
    from torchmetrics.image.fid import NoTrainInceptionV3

    try:
        return NoTrainInceptionV3(name="inception-v3-compat", features_list=[output],
                                  feature_extractor_weights_path=None if weights is None else str(Path(weights).expanduser()))
    except (URLError, OSError) as err:
        raise MissingWeightsError(f"Inception weights ({INCEPTION_FILE}) are not available offline; set "
                                  f"{key}=/path/to/{INCEPTION_FILE}") from err


class VGG16Features(nn.Module):
    """VGG-16's fc2 output (4096, before its ReLU) of uint8 ``[B, 3, 224, 224]`` images: ``x / 255``, ImageNet
    normalisation, the convolutions, then ``classifier[:4]`` (fc1, ReLU, dropout (off in eval), fc2), as
    ``extract_features`` of the improved precision / recall code (youngjung/improved-precision-and-recall-metric-pytorch,
    copied into LANTERN's ``entrypoints/eval_prec_recall.py``)."""

    def __init__(self, vgg: nn.Module) -> None:
        super().__init__()
        self.vgg = vgg.eval()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images.float() / 255.0 - self.mean) / self.std
        return self.vgg.classifier[:4](torch.flatten(self.vgg.avgpool(self.vgg.features(x)), 1))


def vgg16_network(weights: str | None, key: str) -> VGG16Features:
    """:class:`VGG16Features` of torchvision's ImageNet VGG-16; ``weights``: its local file (``key``), null for the
    torch hub cache. A missing file is one line naming the fetch command, before anything loads."""
    from torchvision.models import VGG16_Weights, vgg16

    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise missing_file("VGG-16", weights, key)
        vgg = vgg16(weights=None)
        vgg.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return VGG16Features(vgg)
    try:
        return VGG16Features(vgg16(weights=VGG16_Weights.IMAGENET1K_V1))
    except (URLError, OSError) as err:
        raise MissingWeightsError(f"VGG-16 weights ({VGG16_FILE}) are not available offline; {VGG16_FETCH} and set "
                                  f"{key}=/path/to/{VGG16_FILE}") from err


def missing_file(network: str, weights: str, key: str) -> MissingWeightsError:
    """The one-line error of a named but missing weights file of ``network`` (``Inception`` or ``VGG-16``)."""
    fetch = f"copy {INCEPTION_FILE} there" if network == "Inception" else VGG16_FETCH
    return MissingWeightsError(f"{network} weights not found at '{weights}' ({key}): {fetch}")


def check_inception_files(names: Sequence[str], eval_cfg: object) -> None:
    """The one-line :class:`MissingWeightsError` of a named but missing Inception (or, for ``precision_recall`` on
    ``features: vgg16``, VGG-16) weights file of the metrics ``names`` (``inception_score``, ``precision_recall``),
    loading nothing."""
    for name in ("inception_score", "precision_recall"):
        if name not in names:
            continue
        cfg = getattr(eval_cfg, name)
        vgg = name == "precision_recall" and cfg.features == "vgg16"
        weights, key = (cfg.vgg16_weights, "vgg16_weights") if vgg else (cfg.inception_weights, "inception_weights")
        if weights is not None and not Path(weights).expanduser().is_file():
            raise missing_file("VGG-16" if vgg else "Inception", weights, f"eval.{name}.{key}")


@torch.no_grad()
def extract(features: Features, batches: Iterable[torch.Tensor], device: torch.device) -> np.ndarray:
    """``[N, D]`` float64 features of every batch."""
    out = [features(b.to(device)).double().cpu() for b in batches]
    return torch.cat(out).numpy() if out else np.zeros((0, 0))


# ------------------------------------------------------------------------------------------- Inception score


def _entropy(p: np.ndarray) -> np.ndarray:
    """``-sum p log p`` along the last axis (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(-1)


def image_kl(probs: np.ndarray) -> np.ndarray:
    """``[N]``: ``KL(p(y|x_i) || p(y))`` with ``p(y)`` the mean of the rows of ``probs`` ``[N, C]``;
    ``exp(mean)`` is the one-part Inception score."""
    marginal = probs.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(probs > 0, probs * (np.log(probs) - np.log(marginal)), 0.0).sum(-1)


def inception_score(probs: np.ndarray, splits: int) -> tuple[float, float]:
    """Mean and standard deviation (ddof 0, as torch-fidelity; torchmetrics uses ddof 1) over ``splits``
    contiguous parts of ``exp(H(p_part(y)) - mean H(p(y|x)))``."""
    scores = [float(np.exp(_entropy(part.mean(0)) - _entropy(part).mean()))
              for part in np.array_split(probs, splits) if len(part)]
    return float(np.mean(scores)), float(np.std(scores))


def inception_score_interval(probs: np.ndarray, prompt_ids: Sequence[str], splits: int, n_boot: int,
                             seed: int = SEED) -> list[float] | None:
    """95 % percentile interval of :func:`inception_score`'s mean over prompt resamples (every image of a drawn
    prompt, ``csd.evaluation.intervals``), each resample's images in a seeded random order before the split."""
    if n_boot == 0:
        return None
    res = Resamples.draw(prompt_ids, n_boot, seed)
    members = [np.flatnonzero(res.index == c) for c in range(res.counts.shape[1])]
    rng, draws = np.random.default_rng(seed), []
    for counts in res.counts:
        idx = np.concatenate([np.tile(members[c], int(n)) for c, n in enumerate(counts) if n])
        draws.append(inception_score(probs[rng.permutation(idx)], splits)[0])
    return percentile_interval(np.asarray(draws))


# ------------------------------------------------------------------------------------------- precision / recall


#: bytes of one block of distances (``rows x len(other set)`` float64): memory grows as ``N * block``, never ``N^2``
BLOCK_BYTES = 256 * 2**20
#: the most rows of one block (the row blocks of the full-matrix code this replaced, so a set of up to
#: ``BLOCK_BYTES / 8 / MAX_ROWS`` images is computed by the same ``cdist`` calls)
MAX_ROWS = 4096


def distance_blocks(a: np.ndarray, b: np.ndarray) -> Iterator[tuple[slice, np.ndarray]]:
    """The Euclidean distances ``[len(a), len(b)]`` as row blocks ``(rows, d[rows])``, each at most
    :data:`BLOCK_BYTES` (and :data:`MAX_ROWS` rows)."""
    rows = max(1, min(MAX_ROWS, BLOCK_BYTES // (8 * max(len(b), 1))))
    tb = torch.from_numpy(b)
    for i in range(0, len(a), rows):
        block = slice(i, min(i + rows, len(a)))
        yield block, torch.cdist(torch.from_numpy(a[block]), tb).numpy()


def knn_radii(features: np.ndarray, k: int) -> np.ndarray:
    """Distance of each row to its ``k``-th nearest other row (the row itself, at 0, is neighbour 0), block by
    block."""
    if len(features) <= k:
        raise ValueError(f"k-NN radii need more than k={k} images, got {len(features)}")
    radii = np.empty(len(features))
    for rows, d in distance_blocks(features, features):
        radii[rows] = np.partition(d, k, axis=1)[:, k]
    return radii


def inside(points: np.ndarray, centres: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """``[len(points)]``: point ``i`` lies in some ball of centre ``j`` (``d <= r_j``)."""
    out = np.empty(len(points), dtype=bool)
    for rows, d in distance_blocks(points, centres):
        out[rows] = (d <= radii[None, :]).any(1)
    return out


def precision_recall(generated: np.ndarray, reference: np.ndarray, k: int = 3, prompt_ids: Sequence[str] = (),
                     n_boot: int = 0, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, list[float] | None]:
    """Per generated image: inside the reference manifold (precision = mean); per reference image: inside the
    generated manifold (recall = mean); and recall's 95 % interval over ``n_boot`` resamples of the generated images'
    prompts ``prompt_ids`` (None without), see :func:`recall_interval`. Memory ``O(N * block)``: the distances and
    the coverage are computed a block of rows at a time."""
    in_reference = inside(generated, reference, knn_radii(reference, k))
    radii = knn_radii(generated, k)
    recalled = np.empty(len(reference), dtype=bool)
    interval = RecallInterval(prompt_ids, n_boot, seed) if n_boot else None
    for rows, d in distance_blocks(reference, generated):
        covered_by = d <= radii[None, :]  # [rows, N_gen]: reference image i in generated image j's ball
        recalled[rows] = covered_by.any(1)
        if interval is not None:
            interval.add(covered_by)
    return in_reference, recalled, None if interval is None else interval.result()


class RecallInterval:
    """95 % interval of recall over prompt resamples of the generated set: a reference image is recalled in a
    resample when a drawn image's ball covers it (the radii stay those of the full generated set, so only the drawn
    balls change). Fed the coverage ``[rows, N_gen]`` a block of reference images at a time (:meth:`add`), it keeps
    one count per resample."""

    def __init__(self, prompt_ids: Sequence[str], n_boot: int, seed: int = SEED) -> None:
        self.res = Resamples.draw(prompt_ids, n_boot, seed)
        self.order = np.argsort(self.res.index, kind="stable")  # the generated images grouped by prompt
        self.starts = np.flatnonzero(np.r_[True, np.diff(self.res.index[self.order]) != 0])
        self.recalled = np.zeros(n_boot, dtype=np.int64)
        self.n = 0

    def add(self, covered_by: np.ndarray) -> None:
        # [rows, prompts]: how many images of each prompt cover each reference image
        by_prompt = np.add.reduceat(covered_by[:, self.order].astype(float), self.starts, axis=1)
        self.recalled += ((by_prompt @ self.res.counts.T) > 0).sum(0)
        self.n += len(covered_by)

    def result(self) -> list[float]:
        return percentile_interval(self.recalled / self.n)


# ------------------------------------------------------------------------------------------- metrics


def generated_features(ctx: EvalContext, network: nn.Module, pre: Preprocess | None = None) -> np.ndarray:
    """Features of the run's images after ``pre`` (default: ``eval.fid.transforms``)."""
    pre = pre if pre is not None else Preprocess(ctx.eval.fid.transforms)
    return extract(network.to(ctx.device), file_batches(ctx.images, pre, ctx.eval.batch_size), ctx.device)


def inception_score_metric(ctx: EvalContext) -> MetricOutput:
    """``inception_score`` (mean over ``eval.inception_score.splits`` parts), ``inception_score_std``; per image
    ``is_kl`` = KL(p(y|x) || p(y)) against the whole run's marginal; the interval: prompt resamples."""
    s = ctx.eval.inception_score
    if len(ctx.records) < s.splits:
        raise NotApplicable(f"the Inception score needs at least eval.inception_score.splits={s.splits} images")
    logits = generated_features(ctx, inception_network("logits_unbiased", s.inception_weights,
                                                        "eval.inception_score.inception_weights"))
    probs = torch.from_numpy(logits).softmax(-1).numpy()
    mean, std = inception_score(probs, s.splits)
    interval = inception_score_interval(probs, [r["prompt_id"] for r in ctx.records], s.splits, ctx.eval.bootstrap)
    protocol = {"inception_score": {"features": "inception-v3-torch-fidelity/logits_unbiased", "splits": s.splits,
                                    "transforms": Preprocess(ctx.eval.fid.transforms).describe()}}
    return MetricOutput({"inception_score": mean, "inception_score_std": std}, {"is_kl": image_kl(probs).tolist()},
                        protocol, intervals={"inception_score": interval} if interval else {})
