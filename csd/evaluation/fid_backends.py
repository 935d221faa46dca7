"""FID by the published evaluators themselves: clean-fid (modes ``clean``, ``legacy_tensorflow``, ``legacy_pytorch``)
and pytorch-fid, beside torchmetrics (``eval.fid.backends``; docs/EVALUATION.md#fid-backends).

Each backend is the package's own code path, without its folder walking: the package's resize (clean-fid
``cleanfid.resize.build_resizer(mode)``; pytorch-fid's ``F.interpolate`` inside its ``InceptionV3``), the package's
feature network (clean-fid's torchscript ``InceptionV3W`` or its ``inception_pytorch.InceptionV3``; pytorch-fid's
``InceptionV3``), the package's tensor conversion (clean-fid's ``ResizeDataset``: uint8 -> ``ToTensor() * 255``, float
-> ``ToTensor()``; pytorch-fid's ``ToTensor()``) and the package's Fréchet distance (Heusel et al. 2017, eq. 6:
``d^2 = |mu_g - mu_r|^2 + tr(S_g + S_r - 2 (S_g S_r)^1/2)``, ``scipy.linalg.sqrtm``) on ``np.mean`` / ``np.cov`` of
the features, as both packages compute them.

Weights are read from local files only (never downloaded here): clean-fid's torchscript Inception
``inception-2015-12-05.pt`` (the package's own place: ``/tmp``) and the FID Inception ``pt_inception-2015-12-05-6726825d
.pth`` of pytorch-fid and clean-fid's legacy_pytorch (the package's own place: the torch hub cache
``$TORCH_HOME/hub/checkpoints``); ``eval.fid.weights_dir`` names one folder holding them instead.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from PIL import Image

from csd.errors import MissingWeightsError
from csd.evaluation.fid import cache_key
from csd.evaluation.images import Preprocess, load_rgb, uint8_batches
from csd.registry import FID_BACKENDS

#: clean-fid's torchscript Inception (the StyleGAN2-ADA export of the TF graph): file, URL, the package's folder
TORCHSCRIPT_FILE = "inception-2015-12-05.pt"
TORCHSCRIPT_URL = f"https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/{TORCHSCRIPT_FILE}"
CLEAN_FID_DIR = "/tmp"
#: the FID Inception of pytorch-fid (clean-fid's legacy_pytorch loads the same file): file and URL
PT_INCEPTION_FILE = "pt_inception-2015-12-05-6726825d.pth"
PT_INCEPTION_URL = f"https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/{PT_INCEPTION_FILE}"
#: the pip requirement of the extra that installs these packages
EXTRA = "pip install 'csd-bench[fid]'  (clean-fid==0.1.35 pytorch-fid==0.3.0)"


@dataclass(frozen=True)
class PackageFid:
    """One package's FID: ``prepare`` (an ``[H, W, 3]`` uint8 image -> the ``[3, H', W']`` tensor its network takes,
    the package's resize included), ``network`` (a batch -> features ``[B, D]``) and its Fréchet distance
    ``frechet(mu1, sigma1, mu2, sigma2)``."""

    name: str
    prepare: Callable[[np.ndarray], torch.Tensor]
    network: Callable[[torch.Tensor], torch.Tensor]
    frechet: Callable[..., float]
    features: str

    @property
    def metric(self) -> str:
        """Its key in metrics.json."""
        return FID_BACKENDS[self.name]

    @torch.no_grad()
    def extract(self, images: Iterable[Path | Image.Image], pre: Preprocess, batch_size: int,
                device: torch.device) -> np.ndarray:
        """Features ``[N, D]`` (float64) of ``images`` after the steps ``pre`` (``eval.fid.transforms``), in order."""
        tensors = (self.prepare(np.asarray(pre(load_rgb(image)))) for image in images)
        chunks = [self.network(batch.to(device)).double().cpu().numpy() for batch in uint8_batches(tensors, batch_size)]
        return np.concatenate(chunks) if chunks else np.zeros((0, 0))


def moments(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased covariance of ``[N, D]`` features (``np.mean(axis=0)``, ``np.cov(rowvar=False)``: both
    packages' statistics)."""
    return np.mean(features, axis=0), np.cov(features, rowvar=False)


def _package(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise MissingWeightsError(f"eval.fid.backends needs the package {name.split('.')[0]}: {EXTRA}") from err


def weights_file(file: str, url: str, default_dir: str | Path, weights_dir: str | None, backend: str) -> Path:
    """The local weights ``file`` in ``eval.fid.weights_dir`` (else the package's ``default_dir``); a missing one is
    one :class:`MissingWeightsError` line naming the file and the command that fetches it."""
    folder = Path(weights_dir if weights_dir is not None else default_dir).expanduser()
    path = folder / file
    if not path.is_file():
        raise MissingWeightsError(f"FID backend {backend} needs {path}: fetch it with `wget {url} -P {folder}` "
                                  "(or set eval.fid.weights_dir to the folder holding it)")
    return path


def hub_checkpoints() -> Path:
    """The torch hub cache the packages download to (``$TORCH_HOME/hub/checkpoints``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


@contextlib.contextmanager
def _local_state_dict(module: ModuleType, folder: Path) -> Iterator[None]:
    """Inside: ``module``'s ``load_state_dict_from_url`` (torch's loader, imported by name) reads ``folder``; the
    file is there (:func:`weights_file`), so nothing is downloaded."""
    original = module.load_state_dict_from_url
    module.load_state_dict_from_url = functools.partial(torch.hub.load_state_dict_from_url, model_dir=str(folder))
    try:
        yield
    finally:
        module.load_state_dict_from_url = original


def clean_fid(mode: str, weights_dir: str | None, device: torch.device) -> PackageFid:
    """clean-fid 0.1.35 in ``mode``, as its ``compute_fid(mode=...)`` (``features.build_feature_extractor`` and
    ``utils.ResizeDataset``): ``clean`` resizes to 299 with PIL bicubic on float channels; ``legacy_tensorflow``
    leaves the size to the torchscript network (TF's bilinear inside); ``legacy_pytorch`` resizes with
    ``F.interpolate`` bilinear and feeds pytorch-fid's Inception."""
    resize, fid = _package("cleanfid.resize"), _package("cleanfid.fid")
    name = "clean-fid:" + mode
    fn_resize = resize.build_resizer(mode)
    if mode == "legacy_pytorch":
        inception = _package("cleanfid.inception_pytorch")
        file = weights_file(PT_INCEPTION_FILE, PT_INCEPTION_URL, hub_checkpoints(), weights_dir, name)
        with _local_state_dict(inception, file.parent):
            model = inception.InceptionV3(output_blocks=[3], resize_input=False).to(device).eval()

        def network(x: torch.Tensor) -> torch.Tensor:
            return model(x / 255)[0].squeeze(-1).squeeze(-1)
        features = f"clean-fid legacy_pytorch: {PT_INCEPTION_FILE}"
    else:
        torchscript = _package("cleanfid.inception_torchscript")
        file = weights_file(TORCHSCRIPT_FILE, TORCHSCRIPT_URL, CLEAN_FID_DIR, weights_dir, name)
        network = torchscript.InceptionV3W(str(file.parent), download=False,
                                           resize_inside=mode == "legacy_tensorflow").to(device).eval()
        features = f"clean-fid {mode}: {TORCHSCRIPT_FILE}"

    to_tensor = _package("torchvision.transforms").ToTensor()

    def prepare(image: np.ndarray) -> torch.Tensor:  # utils.ResizeDataset.__getitem__
        resized = fn_resize(image)
        return to_tensor(np.array(resized)) * 255 if resized.dtype == np.uint8 else to_tensor(resized)

    return PackageFid(name, prepare, network, fid.frechet_distance, features + " (2048)")


def pytorch_fid(weights_dir: str | None, device: torch.device) -> PackageFid:
    """pytorch-fid 0.3.0 as its ``calculate_fid_given_paths(dims=2048)``: ``ToTensor()`` to [0, 1], then its
    ``InceptionV3`` resizes to 299 (``F.interpolate`` bilinear, ``align_corners=False``, no antialias), scales to
    [-1, 1] and pools the last block."""
    inception, score = _package("pytorch_fid.inception"), _package("pytorch_fid.fid_score")
    file = weights_file(PT_INCEPTION_FILE, PT_INCEPTION_URL, hub_checkpoints(), weights_dir, "pytorch-fid")
    with _local_state_dict(inception, file.parent):
        model = inception.InceptionV3([inception.InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).to(device).eval()

    to_tensor = _package("torchvision.transforms").ToTensor()  # fid_score.ImagePathDataset's transform

    def prepare(image: np.ndarray) -> torch.Tensor:
        return to_tensor(image)

    def network(x: torch.Tensor) -> torch.Tensor:
        pred = model(x)[0]
        if pred.shape[2:] != (1, 1):  # as fid_score.get_activations
            pred = torch.nn.functional.adaptive_avg_pool2d(pred, output_size=(1, 1))
        return pred.squeeze(3).squeeze(2)

    return PackageFid("pytorch-fid", prepare, network, score.calculate_frechet_distance,
                      f"pytorch-fid: {PT_INCEPTION_FILE} (2048)")


#: backend name -> its builder ``(weights_dir, device) -> PackageFid``; torchmetrics is ``csd.evaluation.fid`` (the
#: names and metric keys: ``csd.registry.FID_BACKENDS``, a test keeps the two equal)
BUILDERS: dict[str, Callable[[str | None, torch.device], PackageFid]] = {
    "clean-fid:clean": functools.partial(clean_fid, "clean"),
    "clean-fid:legacy_tensorflow": functools.partial(clean_fid, "legacy_tensorflow"),
    "clean-fid:legacy_pytorch": functools.partial(clean_fid, "legacy_pytorch"),
    "pytorch-fid": pytorch_fid,
}


def build(name: str, weights_dir: str | None, device: torch.device) -> PackageFid:
    """The package backend ``name`` (weights checked first)."""
    return BUILDERS[name](weights_dir, device)


def check_weights(names: Iterable[str], weights_dir: str | None) -> None:
    """:class:`MissingWeightsError` for the first package backend of ``names`` whose weights file is missing."""
    for name in names:
        if name.startswith("clean-fid:") and name != "clean-fid:legacy_pytorch":
            weights_file(TORCHSCRIPT_FILE, TORCHSCRIPT_URL, CLEAN_FID_DIR, weights_dir, name)
        elif name in BUILDERS:
            weights_file(PT_INCEPTION_FILE, PT_INCEPTION_URL, hub_checkpoints(), weights_dir, name)


def reference_stats(backend: PackageFid, key: dict[str, Any], batches: Callable[[], np.ndarray],
                    cache_dir: str | Path | None) -> tuple[np.ndarray, np.ndarray, int, bool]:
    """Reference mean, covariance, count and whether the cache (``<cache_dir>/fid_ref_<key>.npz``) gave them;
    ``batches()`` (the reference features) runs only on a miss."""
    path = None if cache_dir is None else Path(cache_dir) / f"fid_ref_{cache_key({**key, 'backend': backend.name})}.npz"
    if path is not None and path.exists():
        with np.load(path) as cached:
            return cached["mu"], cached["sigma"], int(cached["n"]), True
    feats = batches()
    mu, sigma = moments(feats)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, mu=mu, sigma=sigma, n=len(feats))
        tmp.replace(path)
    return mu, sigma, len(feats), False
