"""DPG-Bench scoring (Hu et al. 2024, ELLA, arXiv 2403.05135; ``TencentQQGYLab/ELLA``, ``dpg_bench/compute_dpg_bench.py``).

Per image, a VQA model answers each of the prompt's questions; a question scores 1 when the answer is ``yes``, and 0
when any of its parents (the ``dependency`` ids; 0 = none) scored 0 (a detail of an object the image lacks counts
as wrong); the image's score is the mean over its questions, x 100. The benchmark's score is the mean over prompts
of the mean over each prompt's images; per category (``category_broad``: entity, attribute, relation, global, other)
the mean over that category's questions.

The VQA model is pluggable (``eval.dpg.vqa``, a ``module:function`` building a :data:`Vqa` from ``eval.dpg.model`` and
the device). The published one is mPLUG-large (``damo/mplug_visual-question-answering_coco_large_en``), run through
ModelScope's pipeline as the released scorer runs it: :func:`mplug_vqa` (``eval.dpg.vqa=csd.evaluation.dpg_score:
mplug_vqa``; needs ``pip install 'csd-bench[dpg]'`` (ModelScope) and the model folder, neither installed nor downloadable here). The
default backend is transformers' ``BlipForQuestionAnswering`` (e.g. ``Salesforce/blip-vqa-base``): its scores are not
the published numbers; every result names the backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from csd.errors import MissingWeightsError
from csd.evaluation.context import EvalContext, MetricOutput, NotApplicable
from csd.evaluation.images import load_rgb

#: (image, question) -> the answer text
Vqa = Callable[[Image.Image, str], str]
PUBLISHED_VQA = "mPLUG-large (damo/mplug_visual-question-answering_coco_large_en)"


def question_scores(answers: dict[int, str], parents: dict[int, Sequence[int]]) -> dict[int, float]:
    """Per question: 1.0 for ``yes`` (case and spaces ignored), else 0.0; then 0.0 wherever a parent (not 0) was
    scored 0 before this filter (the released code filters on the unfiltered scores, one level)."""
    raw = {q: float(a.strip().lower() == "yes") for q, a in answers.items()}
    return {q: 0.0 if any(p and raw[p] == 0 for p in parents.get(q, ())) else s for q, s in raw.items()}


def score_image(image: Image.Image, questions: Sequence[dict[str, Any]], vqa: Vqa) -> dict[int, float]:
    """Ask every question of one image and apply :func:`question_scores`."""
    answers = {q["id"]: vqa(image, q["question"]) for q in questions}
    return question_scores(answers, {q["id"]: q["parents"] for q in questions})


def dpg_summary(prompt_ids: Sequence[str], image_scores: Sequence[float],
                question_rows: Sequence[tuple[str, float]]) -> dict[str, float]:
    """``dpg_score``: mean over prompts of the mean of their images' scores (in %); ``dpg_<category>``: mean (%)
    over ``question_rows`` (category, filtered score) of every image."""
    by_prompt: dict[str, list[float]] = {}
    for pid, s in zip(prompt_ids, image_scores, strict=True):
        by_prompt.setdefault(pid, []).append(s)
    out = {"dpg_score": float(np.mean([np.mean(v) for v in by_prompt.values()]))}
    for category in dict.fromkeys(c for c, _ in question_rows):
        out[f"dpg_{category}"] = 100.0 * float(np.mean([s for c, s in question_rows if c == category]))
    return out


def blip_vqa(model: str, device: torch.device) -> Vqa:
    """transformers' ``BlipForQuestionAnswering`` from a local directory (greedy answer)."""
    from transformers import BlipForQuestionAnswering, BlipProcessor

    processor = BlipProcessor.from_pretrained(model)
    net = BlipForQuestionAnswering.from_pretrained(model).to(device).eval()

    @torch.no_grad()
    def answer(image: Image.Image, question: str) -> str:
        inputs = processor(images=image, text=question, return_tensors="pt").to(device)
        return processor.decode(net.generate(**inputs, max_new_tokens=5)[0], skip_special_tokens=True)

    return answer


#: the package mplug_vqa needs, as one install line
MODELSCOPE = "pip install 'csd-bench[dpg]'  (modelscope)"


def mplug_vqa(model: str, device: torch.device) -> Vqa:
    """DPG-Bench's published VQA model through ModelScope's ``visual_question_answering`` pipeline on the local folder
    ``model`` (``modelscope download --model damo/mplug_visual-question-answering_coco_large_en --local_dir <dir>``):
    the released scorer's call, ``pipeline(Tasks.visual_question_answering, model=..., device=...)`` then
    ``pipe({"image": image, "question": question})["text"]``; ModelScope names devices ``gpu`` / ``cpu``."""
    try:
        from modelscope.pipelines import pipeline
        from modelscope.utils.constant import Tasks
    except ImportError as err:
        raise MissingWeightsError(f"eval.dpg.vqa=csd.evaluation.dpg_score:mplug_vqa needs ModelScope: {MODELSCOPE}") from err
    pipe = pipeline(Tasks.visual_question_answering, model=model, device="gpu" if device.type == "cuda" else "cpu")

    def answer(image: Image.Image, question: str) -> str:
        return pipe({"image": image, "question": question})["text"]

    return answer


def check_vqa(model: str | None) -> None:
    """The one-line :class:`MissingWeightsError` of a VQA model folder that is not there."""
    if model is None or not Path(model).expanduser().exists():
        what = "eval.dpg.model is not set" if model is None else f"eval.dpg.model={model} not found"
        raise MissingWeightsError(f"{what}: fetch a VQA model, e.g. `hf download "
                                  "Salesforce/blip-vqa-base --local-dir <dir>`, and set eval.dpg.model=<dir>")


def load_vqa(target: str, model: str | None, device: torch.device) -> Vqa:
    """The VQA backend ``target`` (``module:function``) on ``model``, a local directory checked first."""
    check_vqa(model)
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)(str(Path(model).expanduser()), device)


def dpg_metric(ctx: EvalContext) -> MetricOutput:
    """Per image ``dpg_score`` (%, after the dependency filter); ``dpg_score`` and ``dpg_<category>``."""
    metas = [r["meta"].get("dpg") for r in ctx.records]
    if any(m is None for m in metas):
        raise NotApplicable(f"{sum(m is None for m in metas)} of {len(metas)} records have no DPG-Bench questions "
                            "(generate with dataset=dpg_bench)")
    vqa = load_vqa(ctx.eval.dpg.vqa, ctx.eval.dpg.model, ctx.device)
    image_scores, rows = [], []
    for image, meta in zip(ctx.images, metas, strict=True):
        scores = score_image(load_rgb(image), meta["questions"], vqa)
        image_scores.append(100.0 * float(np.mean(list(scores.values()))))
        rows += [(q["category"], scores[q["id"]]) for q in meta["questions"]]
    summary = dpg_summary([r["prompt_id"] for r in ctx.records], image_scores, rows)
    protocol = {"dpg": {"vqa": ctx.eval.dpg.vqa, "model": ctx.eval.dpg.model, "published_vqa": PUBLISHED_VQA}}
    return MetricOutput(summary, {"dpg_score": image_scores}, protocol)
