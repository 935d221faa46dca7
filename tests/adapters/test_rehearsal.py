"""The rehearsal (``model.random_init=true model.layers=K``, docs/MODELS.md "Rehearsal"): a real preset's width,
vocabulary, image grid, CFG rows, prompt length and VQ decoder, with K decoder layers of random weights, built
without reading any file, through the whole pipeline (prompts, engine, VQ decode, PNG, evaluate, report); the memory
plan's weights are the built model's (within 1 kB). The default suite runs Janus-Pro-1B's shape at K = 1 with SJD at
batch 2, and the refusals; ``pytest -m rehearsal`` builds Lumina-mGPT, Anole and Emu3-Gen the same way and runs every
decoding family (AR, SJD, CSD, SJD-PAC, PJD, an EAGLE head of random weights) at batch 1 and 2 on the 1B and 7B
shapes (SJD and PJD on Lumina-mGPT 512 px and Anole), batch 2 token for token batch 1's in fp32.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict
from PIL import Image
from transformers import (
    AutoTokenizer,
    ChameleonConfig,
    Emu3Config,
    Emu3Processor,
    JanusConfig,
    JanusProcessor,
    PreTrainedModel,
)

from csd.compose import Models, check_weights
from csd.drafters.eagle import EagleHead, head_config, save_head
from csd.errors import ConfigError, MissingWeightsError
from csd.evaluate import evaluate_run
from csd.pipeline import generate_run
from csd.plan import config_plan, module_bytes
from csd.records import load_records
from csd.report.build import build_report
from tests.pipeline.test_config import make_cfg

CPU = torch.device("cpu")
REHEARSAL = ("model.random_init=true", "model.layers=1")


def rehearsal_cfg(model: str, run_dir: Path | None, *overrides: str):
    cfg = make_cfg(f"model={model}", *REHEARSAL, "dataset=smoke", "dataset.n_prompts=2", "device=cpu",
                   "engine.progress=false", "engine.warmup=0", "logger=disabled", "eval.metrics=[speed,content]",
                   *overrides)
    with open_dict(cfg):
        cfg.run_dir = None if run_dir is None else str(run_dir)
    return cfg


@pytest.fixture(scope="module")
def models() -> Models:
    """One copy of the rehearsal's weights for the module's runs (the model config is the same)."""
    return Models()


def no_file_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"the rehearsal read a file: {args}")

    for cls in (PreTrainedModel, JanusConfig, JanusProcessor, ChameleonConfig, Emu3Config, Emu3Processor, AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", classmethod(refuse))


@pytest.mark.slow
def test_the_rehearsal_has_the_real_shape_and_reads_no_file(models, monkeypatch) -> None:
    """Janus-Pro-1B's shape (hidden 2048, 16 heads, text vocabulary 102400, 16384 codes on a 24 x 24 grid, two CFG
    rows) with one decoder layer; a COCO-like caption is a prompt of about its real length; the plan's weights are
    the allocated model's bytes."""
    no_file_reads(monkeypatch)
    cfg = rehearsal_cfg("janus_pro_1b", None)
    check_weights(cfg.model)
    adapter = models.adapter(cfg.model, CPU)
    text = adapter.decoder().config
    assert (text.hidden_size, text.num_attention_heads, text.num_hidden_layers, text.vocab_size) == (2048, 16, 1, 102400)
    assert adapter.vocab_size == 16384 and adapter.layout.grid == (24, 24) and adapter.uses_cfg
    assert adapter.decoder().dtype == torch.bfloat16
    caption = "A man riding a wave on top of a surfboard, with a blue sky behind him."
    rows = adapter.prompt_rows(caption)
    assert rows.shape[0] == 2 and 20 <= rows.shape[1] <= 35  # BOS, the template's 11 marks and words, 17, BOI
    assert rows[0, 0] == rows[1, 0] and rows[0, -1] == rows[1, -1] and (rows[1, 1:-1] == rows[1, 1]).all()
    plan = config_plan(cfg)[0]
    # the same modules: only the rotary tables differ (fp32 buffers, planned in the model's dtype)
    assert plan.shape.layers == 1 and abs(plan.shape.weight_bytes - module_bytes(adapter.model)) < 1024


@pytest.mark.slow
def test_the_rehearsal_runs_the_pipeline_end_to_end(tmp_path: Path, models) -> None:
    """SJD at batch 2 on two smoke prompts: 576 tokens an image, 384 x 384 PNGs, the speed and content metrics, the
    report's table."""
    cfg = rehearsal_cfg("janus_pro_1b", tmp_path / "sjd", "method=sjd", "engine.batch_size=2")
    run = generate_run(cfg, models)
    records = load_records(run)
    assert len(records) == 2 and all(len(r["tokens"]) == 576 for r in records)
    assert all(Image.open(run / r["image"]).size == (384, 384) for r in records)
    result = evaluate_run(run, cfg)
    assert result["metrics"]["step_compression"] >= 1.0
    report = build_report([run], cfg)
    assert (report / "table_janus_pro_1b.md").exists()


@pytest.mark.rehearsal
@pytest.mark.parametrize(("model", "length", "prompt_row"), [("lumina_mgpt_7b_512", 1060, (20, 40)),
                                                           ("anole_7b", 1024, (12, 30))])
def test_the_chameleon_rehearsal_has_the_real_shape_and_decodes_real_pixels(model, length, prompt_row,
                                                                            monkeypatch) -> None:
    """Lumina-mGPT (512 px: header, 32 rows of 32 codes and an end-of-line token, ``<eoss>``; an empty unconditional
    prompt) and Anole (32 x 32 raster; its two-token unconditional prompt) on Chameleon-7B's shape with one decoder
    layer and Meta's VQGAN decoder shape (fp32), no file read: a body of random codes decodes to 512 x 512 pixels; the
    plan's weights are the built ones."""
    no_file_reads(monkeypatch)
    cfg = rehearsal_cfg(model, None)
    check_weights(cfg.model)
    adapter = Models().adapter(cfg.model, CPU)
    text = adapter.decoder().config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (4096, 1, 65536) and adapter.vocab_size == 8192
    assert adapter.layout.length == length and adapter.layout.grid == (32, 32) and adapter.uses_cfg
    rows = adapter.prompt_rows("A man riding a wave on top of a surfboard, with a blue sky behind him.")
    assert prompt_row[0] <= len(rows[0]) <= prompt_row[1] and len(rows[1]) == (0 if model.startswith("lumina") else 2)
    forced = adapter.layout.forced_ids
    codes = torch.randint(0, adapter.vocab_size, (length,), generator=torch.Generator().manual_seed(0))
    assert adapter.decode_images(torch.where(forced < 0, adapter.image_token_ids[codes], forced)[None]).shape == (
        1, 512, 512, 3)
    planned = config_plan(cfg)[0].shape.weight_bytes
    assert abs(planned - module_bytes(adapter.model) - module_bytes(adapter.vqgan, torch.float32)) < 1024


@pytest.mark.rehearsal
def test_the_emu3_rehearsal_has_the_real_shape(monkeypatch) -> None:
    """Emu3-Gen's shape (hidden 4096, 8 KV heads, text vocabulary 184622, 32768 codes on a 90 x 90 grid with an
    end-of-line token per row: 8192 body positions) with one decoder layer and the released VQ config, no file read:
    the conditional prompt ends with the image header, the negative prompt is the unconditional row; the plan's
    weights are the built ones. (Its VQ decoder takes about 10 min an image on this CPU: not run here.)"""
    no_file_reads(monkeypatch)
    cfg = rehearsal_cfg("emu3_gen", None)
    check_weights(cfg.model)
    adapter = Models().adapter(cfg.model, CPU)
    text = adapter.decoder().config
    assert (text.hidden_size, text.num_key_value_heads, text.num_hidden_layers, text.vocab_size) == (4096, 8, 1, 184622)
    assert adapter.vocab_size == 32768 and adapter.layout.grid == (90, 90) and adapter.layout.length == 8192
    cond, uncond = adapter.prompt_rows("A man riding a wave on top of a surfboard, with a blue sky behind him.")
    assert 25 <= len(cond) <= 45 and len(uncond) > len(cond) and cond[-1] == uncond[-1]
    planned = config_plan(cfg)[0].shape.weight_bytes
    assert abs(planned - module_bytes(adapter.model)) < 1024


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.layers=1"], "model.layers=1 builds that many decoder layers of random weights (the rehearsal): set "
                         "model.random_init=true too"),
    (["model.random_init=true", "model.path=/nowhere"],
     "model.random_init=true builds the shape of a local checkpoint directory or of deepseek-community/Janus-Pro-7B / "
     "deepseek-community/Janus-Pro-1B (no file read); model.path='/nowhere' is neither"),
    (["model=anole_7b", "model.layers=2"], "model.layers=2 builds that many decoder layers of random weights"),
    (["model=emu3_gen", "model.layers=2"], "model.layers=2 builds that many decoder layers of random weights"),
    (["model=lumina_mgpt_7b", "model.random_init=true", "model.path=org/other"],
     "model.random_init=true builds the shape of a local checkpoint directory or of Alpha-VLLM/Lumina-mGPT-7B-512 / "
     "Alpha-VLLM/Lumina-mGPT-7B-768 / Alpha-VLLM/Lumina-mGPT-7B-1024 (no file read); model.path='org/other' is neither"),
])
def test_a_rehearsal_setting_without_its_counterpart_is_one_line(overrides, message) -> None:
    """Before anything loads (the files check every run makes first)."""
    with pytest.raises((ConfigError, MissingWeightsError), match=re.escape(message)) as err:
        check_weights(make_cfg("model=janus_pro_7b", *overrides).model)
    assert "\n" not in str(err.value)


METHODS = {
    "ar": ["method=ar"],
    "sjd": ["method=sjd"],
    "csd": ["method=csd"],
    "sjd_pac": ["method=sjd_pac"],
    "pjd": ["method=sjd", "drafter=pjd", "drafter.window=8", "drafter.context=12"],
    "eagle": ["method=sjd", "drafter=eagle"],
}


@pytest.mark.rehearsal
@pytest.mark.parametrize(("model", "method"), [
    *((model, method) for model in ("janus_pro_1b", "janus_pro_7b") for method in METHODS),
    *((model, method) for model in ("lumina_mgpt_7b_512", "anole_7b") for method in ("sjd", "pjd")),
])
def test_every_decoding_family_rehearses_at_batch_1_and_2(model, method, tmp_path: Path) -> None:
    """The real width in fp32 (batch 2 decodes each image as batch 1, token for token), one decoder layer; EAGLE
    on a head of random weights of the target's width (SJD-PAC's trees run at batch 1 only)."""
    overrides = [*METHODS[method], "model.dtype=float32"]
    models = Models()
    if method == "eagle":
        adapter = models.adapter(rehearsal_cfg(model, None, *overrides).model, CPU)
        head = tmp_path / "head.pt"
        save_head(EagleHead(head_config(adapter.decoder().config)), head, {"trained": "no: random weights"})
        overrides.append(f"drafter.head={head}")
    runs = {}
    for batch in (1, 2) if method != "sjd_pac" else (1,):
        cfg = rehearsal_cfg(model, tmp_path / f"b{batch}", *overrides, f"engine.batch_size={batch}")
        runs[batch] = generate_run(cfg, models)
        evaluate_run(runs[batch], cfg)
    tokens = [{r["prompt_id"]: r["tokens"] for r in load_records(run)} for run in runs.values()]
    length = models.adapter(rehearsal_cfg(model, None, *overrides).model, CPU).layout.length
    assert all(t == tokens[0] for t in tokens) and all(len(v) == length for v in tokens[0].values())
    assert (build_report(list(runs.values()), rehearsal_cfg(model, None, *overrides)) / f"table_{model}.md").exists()
