"""DPG-Bench scoring on a stand-in VQA model: yes/no scores, the dependency filter, per-image values, the summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import open_dict
from PIL import Image

from csd.data.dpg import dpg_prompts
from csd.errors import MissingWeightsError
from csd.evaluation import dpg_score
from csd.evaluation.context import EvalContext
from csd.evaluation.intervals import run_intervals
from tests.evaluation.test_eval_fixtures import make_run, solid_image
from tests.pipeline.test_config import make_cfg

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def stand_in_vqa(model: str, device: torch.device) -> dpg_score.Vqa:
    """Answers from the image's mean red and blue: a bright image shows everything; red ones a red cube, no ball."""
    def answer(image: Image.Image, question: str) -> str:
        r, _, b = np.asarray(image, dtype=float).mean((0, 1))
        if "ball" in question:
            return "yes" if b > 100 else "no"
        return "Yes " if r > 100 or "sky" in question else "no"
    return answer


def test_a_question_whose_parent_was_answered_no_scores_zero() -> None:
    parents = {1: [0], 2: [0], 3: [1], 4: [1, 2]}
    assert dpg_score.question_scores({1: "yes", 2: "no", 3: "yes", 4: "yes"}, parents) == {1: 1, 2: 0, 3: 1, 4: 0}
    assert dpg_score.question_scores({1: "no", 2: "yes", 3: "yes", 4: "yes"}, parents) == {1: 0, 2: 1, 3: 0, 4: 0}
    assert dpg_score.question_scores({1: " YES", 2: "yes.", 3: "yes", 4: "yes"}, parents)[2] == 0  # only "yes" counts


def test_dpg_metric_on_a_stand_in_vqa(tmp_path: Path) -> None:
    prompts = dpg_prompts(FIXTURES / "dpg_bench.csv")
    metas = [prompts[0].meta, prompts[0].meta, prompts[1].meta]
    red, white = solid_image(0), solid_image(255)
    red[..., 0] = 255
    run = make_run(tmp_path / "run", n_images=3, metas=metas, images=[red, white, red])
    cfg = make_cfg(f"eval.dpg.vqa={__name__}:stand_in_vqa", f"eval.dpg.model={tmp_path}").eval
    out = dpg_score.dpg_metric(EvalContext.load(run, cfg, "cpu"))
    # red: cube yes, ball no, red yes, beside (parent ball no) 0 -> 50 %; white: all yes -> 100 %; sky: 100 %
    assert out.per_image["dpg_score"] == [50.0, 100.0, 100.0]
    assert out.metrics["dpg_score"] == pytest.approx(np.mean([50.0, 100.0, 100.0]))  # prompt p000, p001, p002
    assert out.metrics["dpg_relation"] == 50.0 and out.metrics["dpg_global"] == 100.0
    assert out.metrics["dpg_attribute"] == 100.0 and out.protocol["dpg"]["published_vqa"].startswith("mPLUG-large")
    ids = ["p000", "p001", "p002"]
    assert run_intervals(ids, out.per_image, ["dpg_score"], 100)["dpg_score"][1] <= 100.0


def test_dpg_summary_averages_images_within_a_prompt_first() -> None:
    out = dpg_score.dpg_summary(["a", "a", "b"], [0.0, 100.0, 20.0], [("entity", 1.0), ("entity", 0.0)])
    assert out == {"dpg_score": pytest.approx(35.0), "dpg_entity": 50.0}


def test_missing_vqa_model_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(MissingWeightsError) as err:
        dpg_score.load_vqa(f"{__name__}:stand_in_vqa", str(tmp_path / "none"), torch.device("cpu"))
    assert "\n" not in str(err.value) and "eval.dpg.model=" in str(err.value)
    cfg = make_cfg("dataset=dpg_bench")
    with open_dict(cfg):
        cfg.dataset.name = "dpg_bench"
    from csd.evaluation.metrics import check_files

    with pytest.raises(MissingWeightsError, match="eval.dpg.model is not set"):
        check_files(["dpg"], cfg.eval, cfg)


def test_mplug_backend_calls_modelscope_as_the_released_scorer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``eval.dpg.vqa=csd.evaluation.dpg_score:mplug_vqa`` on a stand-in of ModelScope's API (the package and mPLUG's
    weights are not installable here): one pipeline of the VQA task on the local folder, ModelScope's device names,
    one ``{"image", "question"}`` call per question, the answer its ``text``; no package: one line naming the install."""
    import sys
    import types

    calls: list[tuple] = []

    def pipeline(task: str, model: str, device: str):
        calls.append((task, model, device))
        return lambda inputs: {"text": "yes" if "cube" in inputs["question"] and inputs["image"].size == (4, 4) else "no"}

    pipelines = types.ModuleType("modelscope.pipelines")
    pipelines.pipeline = pipeline
    constant = types.ModuleType("modelscope.utils.constant")
    constant.Tasks = types.SimpleNamespace(visual_question_answering="visual-question-answering")
    for name, module in {"modelscope": types.ModuleType("modelscope"), "modelscope.pipelines": pipelines,
                         "modelscope.utils": types.ModuleType("modelscope.utils"),
                         "modelscope.utils.constant": constant}.items():
        monkeypatch.setitem(sys.modules, name, module)
    vqa = dpg_score.load_vqa("csd.evaluation.dpg_score:mplug_vqa", str(tmp_path), torch.device("cpu"))
    image = Image.new("RGB", (4, 4))
    assert (vqa(image, "is there a cube?"), vqa(image, "is there a ball?")) == ("yes", "no")
    assert calls == [("visual-question-answering", str(tmp_path), "cpu")]
    dpg_score.mplug_vqa(str(tmp_path), torch.device("cuda"))
    assert calls[-1][2] == "gpu"
    monkeypatch.setitem(sys.modules, "modelscope.pipelines", None)  # not installed
    with pytest.raises(MissingWeightsError) as err:
        dpg_score.mplug_vqa(str(tmp_path), torch.device("cpu"))
    assert "\n" not in str(err.value) and "pip install 'csd-bench[dpg]'" in str(err.value)
