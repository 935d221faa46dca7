"""How much the FID evaluators' resize and quantisation move FID, on the committed toy runs, with the toy's CLIP image
features standing in for Inception (docs/EVALUATION.md#fid-backends).

    python -m experiments.fid_sensitivity results/toy_paper/0_ar results/toy_paper/9_csd [--max-images 200]
        [--out results/fid_sensitivity]

Each variant resizes the toy's 32 px images, generated and reference (the rendered held-out scenes of the same prompts,
as the toy's own FID) alike, to Inception's 299 px with a package's own resize function, then the toy CLIP reads them
(it resizes back to 32 px itself, bicubic with antialiasing). The "none" row skips the resize: the toy's committed FID
pipeline. FID = Heusel et al. 2017, eq. 6, by clean-fid's ``frechet_distance``; intervals: the delete-a-group jackknife
of csd.evaluation.fid_interval (reference fixed); ``Δ`` = the variant's FID minus the clean-fid "clean" FID, its
jackknife interval over the same left-out prompt groups (paired). clean-fid's legacy_tensorflow resize runs inside its
torchscript Inception graph and cannot be separated from it: it is not in this table.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from scipy import stats
from torch import nn

from csd.evaluation import toy
from csd.evaluation.clip_features import ClipImageFeatures
from csd.evaluation.context import EvalContext
from csd.evaluation.fid_interval import Moments, jackknife_groups, moments_fid, psd_sqrt
from csd.evaluation.intervals import LEVEL
from csd.presets import CONF_DIR

SIZE = (299, 299)
#: the variant every Δ is taken against
BASE = "clean-fid clean (PIL bicubic, float)"


class _Unnormalise(nn.Module):
    """pytorch-fid's InceptionV3 block standing in: its input (resized, scaled to [-1, 1]) back to [0, 255]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1) / 2 * 255


def pytorch_fid_resize() -> Callable[[np.ndarray], np.ndarray]:
    """pytorch-fid's own resize: ``ToTensor()`` to [0, 1], then its ``InceptionV3.forward`` (``F.interpolate`` to 299,
    bilinear, ``align_corners=False``; ``2x - 1``), run on the package's class with the network's blocks replaced."""
    from pytorch_fid.inception import InceptionV3
    from torchvision.transforms import ToTensor

    model = InceptionV3.__new__(InceptionV3)
    nn.Module.__init__(model)
    model.resize_input, model.normalize_input, model.output_blocks, model.last_needed_block = True, True, [0], 0
    model.blocks = nn.ModuleList([_Unnormalise()])
    to_tensor = ToTensor()

    def resize(image: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(to_tensor(image)[None])[0][0].permute(1, 2, 0).numpy()

    return resize


def variants() -> dict[str, Callable[[np.ndarray], np.ndarray] | None]:
    """Variant -> the package's resize (``[H, W, 3]`` uint8 -> 299 x 299 float or uint8); None: no resize."""
    from cleanfid.resize import build_resizer, make_resizer

    return {
        BASE: build_resizer("clean"),
        "clean-fid clean, quantised to uint8": make_resizer("PIL", True, "bicubic", SIZE),
        "clean-fid legacy_pytorch (torch bilinear, float)": build_resizer("legacy_pytorch"),
        "clean-fid legacy_pytorch, quantised to uint8 (truncated)": make_resizer("PyTorch", True, "bilinear", SIZE),
        "pytorch-fid (its InceptionV3's torch bilinear on [0, 1])": pytorch_fid_resize(),
        "PIL bilinear, quantised to uint8": make_resizer("PIL", True, "bilinear", SIZE),
        "none (the toy's own FID pipeline)": None,
    }


@torch.no_grad()
def features(net: nn.Module, images: Sequence[np.ndarray], resize: Callable[[np.ndarray], np.ndarray] | None,
             batch_size: int = 32) -> torch.Tensor:
    """``[N, D]`` float64 toy-CLIP features of the ``[H, W, 3]`` uint8 ``images`` after ``resize``."""
    chunks = []
    for start in range(0, len(images), batch_size):
        batch = [np.asarray(resize(im) if resize else im, dtype=np.float32) for im in images[start:start + batch_size]]
        chunks.append(net(torch.from_numpy(np.stack(batch)).permute(0, 3, 1, 2)).double())
    return torch.cat(chunks)


def left_out_fids(gen: torch.Tensor, ref: torch.Tensor, group: np.ndarray) -> tuple[float, np.ndarray]:
    """The FID of ``gen`` against ``ref`` (reference mean and unbiased covariance fixed) and without each group."""
    ref_mean, ref_cov = ref.mean(0), torch.cov(ref.T)
    ref_sqrt = psd_sqrt(ref_cov)
    whole = Moments.of(gen, ref_sqrt)
    g = torch.as_tensor(group)
    left = [moments_fid(whole - Moments.of(gen[g == k], ref_sqrt), ref_mean, ref_cov, ref_sqrt)
            for k in range(int(group.max()) + 1)]
    return moments_fid(whole, ref_mean, ref_cov, ref_sqrt), np.array(left)


def jackknife(full: float, left: np.ndarray, level: float = LEVEL) -> list[float]:
    """``full +- t_{g-1} se``, se = sqrt((g - 1) / g * sum (theta_k - mean theta)^2) (delete-a-group jackknife)."""
    g = len(left)
    se = float(np.sqrt((g - 1) / g * np.square(left - left.mean()).sum()))
    half = float(stats.t.ppf(0.5 + level / 2, g - 1)) * se
    return [full - half, full + half]


def sensitivity(run_dir: Path, max_images: int | None = None, names: Sequence[str] | None = None
                ) -> list[dict[str, Any]]:
    """One row per variant of :func:`variants` (``names``: those only, :data:`BASE` always) for the run's first
    ``max_images`` images: FID, its interval, Δ vs :data:`BASE` and its paired interval."""
    eval_cfg = OmegaConf.load(CONF_DIR / "eval" / "default.yaml")
    ctx = EvalContext.load(run_dir, eval_cfg, "cpu")
    if not ctx.is_toy:
        raise SystemExit(f"{run_dir}: model={ctx.info['model']} is not a toy model (the toy CLIP stands in here)")
    records = ctx.records[:max_images]
    generated = [np.asarray(im) for im in ctx.images[:len(records)]]
    _, ref_batches = toy.rendered_reference(records, eval_cfg.toy.render, 64)
    reference = [im.permute(1, 2, 0).numpy() for batch in ref_batches() for im in batch]
    net = ClipImageFeatures(toy.load_toy_clip_model(torch.device("cpu")))
    group = jackknife_groups([r["prompt_id"] for r in records])
    chosen = {k: v for k, v in variants().items() if names is None or k == BASE or k in names}
    fids = {name: left_out_fids(features(net, generated, resize), features(net, reference, resize), group)
            for name, resize in chosen.items()}
    base_full, base_left = fids[BASE]
    rows = []
    for name, (full, left) in fids.items():
        lo, hi = jackknife(full, left)
        d_lo, d_hi = jackknife(full - base_full, left - base_left)
        rows.append({"run": str(run_dir), "method": ctx.info["method"], "images": len(records), "variant": name,
                     "fid": full, "fid_lo": max(0.0, lo), "fid_hi": hi, "delta": full - base_full, "delta_lo": d_lo,
                     "delta_hi": d_hi, "groups": int(group.max()) + 1})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| run | images | variant | FID [95 % jackknife] | Δ vs clean-fid clean [95 %] | Δ / FID(clean) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = {r["run"]: r["fid"] for r in rows if r["variant"] == BASE}
    for r in rows:
        lines.append(f"| {r['run']} | {r['images']} | {r['variant']} | {r['fid']:.4g} [{r['fid_lo']:.4g}, "
                     f"{r['fid_hi']:.4g}] | {r['delta']:+.3g} [{r['delta_lo']:+.3g}, {r['delta_hi']:+.3g}] | "
                     f"{r['delta'] / base[r['run']]:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.fid_sensitivity",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished toy run directories")
    parser.add_argument("--max-images", type=int, default=None, help="the first N records of each run (default: all)")
    parser.add_argument("--variants", nargs="*", default=None, help="variant names (default: all)")
    parser.add_argument("--out", type=Path, default=Path("results/fid_sensitivity"))
    args = parser.parse_args(argv)
    rows = [row for run in args.runs for row in sensitivity(run, args.max_images, args.variants)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    (args.out / "table.md").write_text(
        "FID of toy runs under the FID evaluators' resizes, toy CLIP features standing in for Inception "
        f"(`python -m experiments.fid_sensitivity {' '.join(map(str, args.runs))}"
        + (f" --max-images {args.max_images}" if args.max_images else "") + "`).\n\n" + markdown(rows),
        encoding="utf-8")
    print(markdown(rows))


if __name__ == "__main__":
    main()
