"""The published FID evaluators (eval.fid.backends) on their real code paths, with a small seeded network standing in
for Inception (no weights in tests): each calls its package's resize and gives the Fréchet distance of a numpy / scipy
reference on the same features; missing weights are one actionable line; bad lists are refused; the report shows one
column per evaluator with its interval."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import ListConfig, OmegaConf
from PIL import Image
from scipy import linalg
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluation import fid_backends
from csd.evaluation.images import Preprocess
from csd.keys import SCHEMA
from csd.presets import CONF_DIR
from csd.registry import FID_BACKENDS

cleanfid_resize = pytest.importorskip("cleanfid.resize")
pytorch_fid_inception = pytest.importorskip("pytorch_fid.inception")
import cleanfid.inception_pytorch  # noqa: E402
import cleanfid.inception_torchscript  # noqa: E402

PACKAGES = [name for name in FID_BACKENDS if name != "torchmetrics"]
CPU = torch.device("cpu")


class StandInW(nn.Module):
    """clean-fid's torchscript ``InceptionV3W(path, download, resize_inside)`` in miniature: [0, 255] in, 16 out."""

    inputs: list[tuple[int, ...]] = []

    def __init__(self, path: str, download: bool = True, resize_inside: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.resize_inside = nn.Conv2d(3, 16, 5, stride=4), resize_inside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        StandInW.inputs.append(tuple(x.shape))
        return torch.tanh(self.conv((x - 128) / 128)).mean(dim=(2, 3))


def stand_in_inception() -> SimpleNamespace:
    """The FID Inception's layers as its ``InceptionV3`` wrappers read them, two small seeded convolutions."""
    torch.manual_seed(1)
    layers = {name: nn.Identity() for name in (
        "Conv2d_2a_3x3", "Conv2d_2b_3x3", "Conv2d_3b_1x1", "Conv2d_4a_3x3", "Mixed_5b", "Mixed_5c", "Mixed_5d",
        "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7b", "Mixed_7c")}
    layers["Conv2d_1a_3x3"] = nn.Conv2d(3, 8, 3, stride=2)
    layers["Mixed_7a"] = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2), nn.Tanh())
    return SimpleNamespace(**layers)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """Stand-in networks in the packages, weights files present, and spies on the packages' resizes."""
    monkeypatch.setattr(cleanfid.inception_torchscript, "InceptionV3W", StandInW)
    monkeypatch.setattr(cleanfid.inception_pytorch, "fid_inception_v3", stand_in_inception)
    monkeypatch.setattr(pytorch_fid_inception, "fid_inception_v3", stand_in_inception)
    for file in (fid_backends.TORCHSCRIPT_FILE, fid_backends.PT_INCEPTION_FILE):
        (tmp_path / file).touch()
    calls: dict[str, list] = {"build_resizer": [], "interpolate": []}
    build_resizer, interpolate = cleanfid_resize.build_resizer, torch.nn.functional.interpolate
    monkeypatch.setattr(cleanfid_resize, "build_resizer", lambda mode: calls["build_resizer"].append(mode)
                        or build_resizer(mode))

    def spy_interpolate(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls["interpolate"].append((tuple(x.shape[2:]), kwargs.get("size"), kwargs.get("mode")))
        return interpolate(x, *args, **kwargs)

    monkeypatch.setattr(pytorch_fid_inception.F, "interpolate", spy_interpolate)
    StandInW.inputs = []
    return {"dir": str(tmp_path), "calls": calls}


def pictures(n: int, shift: int, size: tuple[int, int] = (48, 40)) -> list[Image.Image]:
    rng = np.random.default_rng(shift)
    return [Image.fromarray(np.clip(rng.integers(0, 200, (size[1], size[0], 3)) + shift, 0, 255).astype(np.uint8))
            for _ in range(n)]


def scipy_fid(a: np.ndarray, b: np.ndarray) -> float:
    """Heusel et al. 2017, eq. 6, written out: |mu_a - mu_b|^2 + tr(S_a + S_b - 2 sqrtm(S_a S_b))."""
    sa, sb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    return float(np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(sa + sb - 2 * linalg.sqrtm(sa @ sb).real))


def test_registry_names_every_builder() -> None:
    assert set(FID_BACKENDS) == {"torchmetrics", *fid_backends.BUILDERS}
    assert len(set(FID_BACKENDS.values())) == len(FID_BACKENDS)


@pytest.mark.parametrize("name", PACKAGES)
def test_backend_uses_its_package_resize_and_frechet_distance(name: str, stand_ins: dict[str, Any]) -> None:
    backend = fid_backends.build(name, stand_ins["dir"], CPU)
    real = backend.extract(pictures(24, 0), Preprocess(), 8, CPU)
    fake = backend.extract(pictures(24, 30), Preprocess(), 8, CPU)
    assert real.shape == fake.shape == (24, 16)
    value = backend.frechet(*fid_backends.moments(fake), *fid_backends.moments(real))
    assert value == pytest.approx(scipy_fid(fake, real), rel=1e-6)
    assert value > 10 * abs(backend.frechet(*fid_backends.moments(real), *fid_backends.moments(real)))
    calls = stand_ins["calls"]
    if name.startswith("clean-fid:"):
        assert calls["build_resizer"] == [name.split(":")[1]]
    if name in ("clean-fid:clean", "clean-fid:legacy_tensorflow"):  # clean: resized to 299 before the network
        assert set(StandInW.inputs) == {(8, 3, 299, 299) if name.endswith("clean") else (8, 3, 40, 48)}
    if name == "pytorch-fid":  # resized inside its InceptionV3: bilinear, 299
        assert set(calls["interpolate"]) == {((40, 48), (299, 299), "bilinear")}


def test_missing_weights_are_one_actionable_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingWeightsError) as err:
        fid_backends.build("clean-fid:clean", str(tmp_path), CPU)
    message = str(err.value)
    assert "\n" not in message and fid_backends.TORCHSCRIPT_FILE in message and f"wget {fid_backends.TORCHSCRIPT_URL}" in message
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(MissingWeightsError, match=r"pytorch-fid needs .*torch/hub/checkpoints/pt_inception.*wget"):
        fid_backends.build("pytorch-fid", None, CPU)
    with pytest.raises(MissingWeightsError, match="clean-fid:legacy_pytorch needs"):
        fid_backends.check_weights(["torchmetrics", "clean-fid:legacy_pytorch"], None)


def test_backends_list_is_checked_in_one_line() -> None:
    spec = SCHEMA["eval.fid.backends"]
    assert "empty" in spec.error("eval.fid.backends", ListConfig([]))
    assert "'pytorch-fid' is listed twice" in spec.error("eval.fid.backends", ListConfig(["pytorch-fid", "pytorch-fid"]))
    assert "unknown FID backend 'clean'" in spec.error("eval.fid.backends", ListConfig(["clean"]))
    assert spec.error("eval.fid.backends", ListConfig(list(FID_BACKENDS))) is None
    assert list(OmegaConf.load(CONF_DIR / "eval" / "default.yaml").fid.backends) == ["torchmetrics"]


def fid_context(tmp_path: Path, n: int, **fid: Any) -> SimpleNamespace:
    """An evaluation context of ``n`` generated pictures against ``n`` reference pictures in a folder, with
    ``eval.fid`` of the default preset updated by ``fid``."""
    ref = tmp_path / "ref"
    ref.mkdir()
    for i, image in enumerate(pictures(n, 0)):
        image.save(ref / f"{i:02d}.png")
    eval_cfg = OmegaConf.load(CONF_DIR / "eval" / "default.yaml")
    eval_cfg.fid.update(paired=False, reference_dir=str(ref), cache_dir=str(tmp_path / "cache"), **fid)
    records = [{"prompt_id": f"p{i}", "sample": 0, "meta": {}, "prompt": "x"} for i in range(n)]
    return SimpleNamespace(eval=eval_cfg, records=records, images=pictures(n, 30), device=CPU, is_toy=False,
                           run_config=OmegaConf.create({}), info={})


def test_fid_metric_writes_one_key_per_backend_with_intervals(stand_ins: dict[str, Any], tmp_path: Path) -> None:
    from csd.evaluation.metrics import fid_metric

    ctx = fid_context(tmp_path, 24, backends=["clean-fid:clean", "pytorch-fid"], weights_dir=stand_ins["dir"])
    out = fid_metric(ctx)
    assert set(out.metrics) == set(out.intervals) == {"fid_clean", "fid_pytorch"}
    for key, value in out.metrics.items():
        lo, hi = out.intervals[key]
        assert lo <= value <= hi and out.protocol[key]["reference_cached"] is False
    again = fid_metric(ctx)
    assert again.metrics == pytest.approx(out.metrics) and again.protocol["fid_clean"]["reference_cached"] is True


def test_report_shows_one_column_per_backend(tmp_path: Path) -> None:
    from csd.report.collect import results_frame
    from csd.report.table import console_tables, markdown_table

    metrics = {"latency_mean": 1.0, "step_compression": 1.0, "fid": 10.0, "fid_clean": 11.0, "fid_pytorch": 12.5}
    result = {"run_dir": "runs/ar", "run": {"method": "ar", "method_params": {"window": 1}, "model": "janus",
                                            "dataset": "coco2017", "n_records": 40},
              "metrics": metrics, "intervals": {k: [v - 1, v + 1] for k, v in metrics.items() if k.startswith("fid")}}
    df = results_frame([result])
    markdown, _ = markdown_table(df)
    console = console_tables(df, tmp_path)
    for header, cell in (("FID", "10.0 [9.0, 11.0]"), ("FID clean-fid", "11.0 [10.0, 12.0]"),
                         ("FID pytorch-fid", "12.5 [11.5, 13.5]")):
        for text in (markdown, console):
            assert f" {header} " in text and cell in text


def test_local_weights_are_read_from_the_folder(tmp_path: Path) -> None:
    """The packages' own loader call (``load_state_dict_from_url(FID_WEIGHTS_URL)``) reads the local file."""
    torch.save({"w": torch.ones(2)}, tmp_path / fid_backends.PT_INCEPTION_FILE)
    original = pytorch_fid_inception.load_state_dict_from_url
    with fid_backends._local_state_dict(pytorch_fid_inception, tmp_path):
        state = pytorch_fid_inception.load_state_dict_from_url(pytorch_fid_inception.FID_WEIGHTS_URL, progress=True)
    assert torch.equal(state["w"], torch.ones(2)) and pytorch_fid_inception.load_state_dict_from_url is original
    assert pytorch_fid_inception.FID_WEIGHTS_URL == fid_backends.PT_INCEPTION_URL
    assert cleanfid.inception_pytorch.FID_WEIGHTS_URL == fid_backends.PT_INCEPTION_URL
    assert cleanfid.inception_torchscript.inception_url == fid_backends.TORCHSCRIPT_URL


class TinyGraph(nn.Module):
    """A TorchScript file in the place of clean-fid's ``inception-2015-12-05.pt``: ``layers`` maps the normalised
    299 px image to 2048 features (``forward`` is the graph's own-resize entry, unused in clean mode)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.layers = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Conv2d(3, 2048, 4))

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        return self.layers(x)


def test_clean_fid_loads_the_local_torchscript_file(tmp_path: Path) -> None:
    """clean-fid's own ``InceptionV3W`` wrapper, unpatched, on a local TorchScript file: 2048 features per image."""
    torch.jit.script(TinyGraph()).save(str(tmp_path / fid_backends.TORCHSCRIPT_FILE))
    backend = fid_backends.build("clean-fid:clean", str(tmp_path), CPU)
    feats = backend.extract(pictures(3, 0), Preprocess(), 8, CPU)
    assert feats.shape == (3, 2048) and np.isfinite(feats).all()


def test_package_backends_take_their_own_steps(stand_ins: dict[str, Any], tmp_path: Path) -> None:
    """``eval.fid.package_transforms`` replaces ``eval.fid.transforms`` for the package backends only (a protocol's
    imitation of clean-fid's resize stays in front of torchmetrics); null keeps the shared steps."""
    from csd.evaluation.metrics import fid_metric

    ctx = fid_context(tmp_path, 8, backends=["clean-fid:clean"], weights_dir=stand_ins["dir"], transforms=["bilinear:32"])
    eval_cfg = ctx.eval
    shared = fid_metric(ctx)
    assert shared.protocol["fid_clean"]["transforms"] == Preprocess(["bilinear:32"]).describe()
    eval_cfg.fid.package_transforms = ["center_crop:24"]
    own = fid_metric(ctx)
    assert own.protocol["fid_clean"]["transforms"] == Preprocess(["center_crop:24"]).describe()
    assert own.metrics["fid_clean"] != pytest.approx(shared.metrics["fid_clean"])


def test_a_backend_without_weights_is_skipped_alone(stand_ins: dict[str, Any], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One evaluator's missing weights skip that evaluator only (its key under ``skipped`` with the fetch line), so
    a protocol can list several; eval.strict raises instead, and with every evaluator missing the metric is skipped
    as a whole (the error propagates)."""
    from csd.evaluation.metrics import fid_metric

    (Path(stand_ins["dir"]) / fid_backends.PT_INCEPTION_FILE).unlink()  # pytorch-fid's weights are missing
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    ctx = fid_context(tmp_path, 8, backends=["clean-fid:clean", "pytorch-fid"], weights_dir=stand_ins["dir"])
    eval_cfg = ctx.eval
    out = fid_metric(ctx)
    assert set(out.metrics) == {"fid_clean"}
    assert set(out.skipped) == {"fid_pytorch"} and "wget" in out.skipped["fid_pytorch"]
    eval_cfg.strict = True
    with pytest.raises(MissingWeightsError, match="pytorch-fid needs"):
        fid_metric(ctx)
    eval_cfg.strict = False
    eval_cfg.fid.backends = ["pytorch-fid"]
    with pytest.raises(MissingWeightsError, match="pytorch-fid needs"):
        fid_metric(ctx)


def test_reference_cache_misses_when_a_reference_file_changes_at_the_same_size(stand_ins: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    """The reference statistics are keyed by the files' contents, not their paths and sizes: a reference image
    replaced by another of the same size (BMP: size fixed by the dimensions) recomputes them; unchanged files reuse
    them."""
    ctx = fid_context(tmp_path, 12, backends=["pytorch-fid"], weights_dir=stand_ins["dir"])
    ref = Path(ctx.eval.fid.reference_dir)
    for png in sorted(ref.glob("*.png")):
        Image.open(png).save(png.with_suffix(".bmp"))
        png.unlink()
    from csd.evaluation.metrics import fid_metric

    def cached() -> bool:
        return fid_metric(ctx).protocol["fid_pytorch"]["reference_cached"]

    assert not cached() and cached()
    size = (ref / "00.bmp").stat().st_size
    pictures(1, 99)[0].save(ref / "00.bmp")
    assert (ref / "00.bmp").stat().st_size == size
    assert not cached() and cached()
