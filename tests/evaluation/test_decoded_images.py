"""Every reader of a run's images works without its PNGs, on the decodes of the records' tokens (csd.decode): the
evaluate stage (toy CLIP score, FID, scene checker, regions), the report, sample grids and the GenEval export give
what they give with the PNGs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from csd.data.geneval import export_geneval
from csd.evaluate import evaluate_run
from csd.evaluation import PER_IMAGE_FILE
from csd.evaluation.context import EvalContext
from csd.report import build_report
from experiments.make_sample_grid import sample_grid
from tests.evaluation.test_eval_fixtures import eval_cfg, make_run


def toy_run(run_dir: Path, n_images: int = 4, metas: list[dict] | None = None) -> Path:
    """A toy-model run whose records hold the tokens of the toy's reference scenes for held-out prompts, its PNGs the
    toy tokenizer's decodes of them (what the generate stage writes)."""
    domain = pytest.importorskip("csd.toy.domain")
    from csd.toy import TOKENIZER_FILE
    from csd.toy.tokenizer import PatchTokenizer

    tokenizer = PatchTokenizer.load(TOKENIZER_FILE)
    prompts = domain.toy_prompts(n_prompts=n_images, split="heldout")
    tokens = tokenizer.encode(np.stack([domain.heldout_scene(p)[0] for p in prompts]))
    return make_run(run_dir, "csd", n_images=n_images, grid=(16, 16), relaxed_every=4,
                    method_params={"lam": 0.5, "delta": 0.3}, metas=metas or [p.meta for p in prompts],
                    tokens=tokens.tolist(), images=list(tokenizer.decode(tokens).numpy()))


def per_image(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / PER_IMAGE_FILE).read_text().splitlines()]


@pytest.mark.slow
def test_evaluate_without_pngs_gives_what_it_gives_with_them(tmp_path: Path) -> None:
    run = toy_run(tmp_path / "r")
    cfg = eval_cfg(tmp_path)
    with_pngs = evaluate_run(run, cfg)
    assert {"clip_score", "fid", "scene_acc_overall", "relaxed_rate_object"} <= set(with_pngs["metrics"])
    assert with_pngs["metrics"]["scene_acc_overall"] > 0.5  # the images are the scenes: the checker sees them
    rows = per_image(run)
    shutil.rmtree(run / "images")
    without = evaluate_run(run, cfg)
    assert without["metrics"] == pytest.approx(with_pngs["metrics"], nan_ok=True)
    assert without["content"]["regions"] == with_pngs["content"]["regions"]
    assert per_image(run) == rows
    assert not (run / "images").exists()  # readers decode in memory; they write no PNG


@pytest.mark.slow
def test_report_of_a_sweep_without_pngs(tmp_path: Path) -> None:
    """The report reads metrics.json and the records (its figures are of acceptance, not samples)."""
    run = toy_run(tmp_path / "sweep" / "0_csd")
    shutil.rmtree(run / "images")
    cfg = eval_cfg(tmp_path)
    evaluate_run(run, cfg)
    report = build_report(tmp_path / "sweep", cfg)
    assert "0_csd" in (report / "runs.csv").read_text() and (report / "pareto_toy.png").exists()


def test_eval_context_decodes_only_the_images_without_a_png(tmp_path: Path) -> None:
    run = toy_run(tmp_path / "r", n_images=3)
    records = json.loads((run / "records.jsonl").read_text().splitlines()[1])
    (run / records["image"]).unlink()
    ctx = EvalContext.load(run, eval_cfg(tmp_path).eval, "cpu")
    pngs = [np.asarray(image) for image in ctx.images]
    assert ctx.images.decoded == 1
    assert all(np.array_equal(a, ctx.images.decode(r)) for a, r in zip(pngs, ctx.records, strict=True))


def test_sample_grid_and_geneval_export_without_pngs(tmp_path: Path) -> None:
    metas = [{"index": i, "geneval": {"tag": "single_object", "include": [{"class": "cat", "count": 1}],
                                      "prompt": f"caption {i}"}} for i in range(2)]
    run = toy_run(tmp_path / "r", n_images=2, metas=metas)
    wrote = [(run / "images" / f"p{i:03d}_s0.png").read_bytes() for i in range(2)]
    grid = np.asarray(sample_grid([run], n=2, tile=64))
    shutil.rmtree(run / "images")
    torch.manual_seed(0)
    assert np.array_equal(np.asarray(sample_grid([run], n=2, tile=64)), grid)
    out = export_geneval(run, tmp_path / "geneval")
    assert [(out / f"{i:05d}" / "samples" / "0000.png").read_bytes() for i in range(2)] == wrote


def test_a_corrupt_or_empty_png_is_said_once_and_decoded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A zero-byte PNG and a truncated one are not read: their images are the records' decodes, and the evaluation says
    so in one warning line naming the first file; the metrics are those with intact PNGs."""
    run = toy_run(tmp_path / "r")
    cfg = eval_cfg(tmp_path, **{"eval.metrics": ["clip_score"], "eval.bootstrap": 0})
    intact = evaluate_run(run, cfg)["metrics"]["clip_score"]
    pngs = sorted((run / "images").glob("*.png"))
    pngs[1].write_bytes(b"")
    pngs[2].write_bytes(pngs[2].read_bytes()[:100])
    caplog.clear()
    with caplog.at_level("WARNING", logger="csd"):
        assert evaluate_run(run, cfg)["metrics"]["clip_score"] == intact
    said = [r.getMessage() for r in caplog.records if "PNG" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    assert pngs[1].name in said[0] and "decoded from" in said[0]


def test_a_missing_config_yaml_is_said_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = toy_run(tmp_path / "r")
    (run / "config.yaml").unlink()
    with caplog.at_level("WARNING", logger="csd"):
        EvalContext.load(run, eval_cfg(tmp_path).eval, "cpu")
    said = [r.getMessage() for r in caplog.records if "config.yaml" in r.getMessage()]
    assert len(said) == 1 and "run.json" in said[0] and "\n" not in said[0], said
