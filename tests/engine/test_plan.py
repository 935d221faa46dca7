"""The memory planner (``csd.plan``, docs/PERFORMANCE.md "Memory plan") against what the adapters and
``csd.ragged.SlotBatch`` actually allocate on CPU, and ``engine.batch_size=auto``.

Checked on CPU, for the toy and the four tiny models: the weights (every parameter and buffer of the modules the
adapter holds) and the KV cache tensors of a batch of slots, within 20 % of the plan (measured: equal). On the
rehearsal's real Janus-Pro-1B shape at one decoder layer (``experiments/bench_memory.py``): weights, KV cache and mask
table within 10 %, and the transient peaks of a prefill and of an iteration (resident high-water marks) no more than
10 % above the plan. The GPU check (``experiments/gpu_check.py``) compares the whole plan with
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from csd.cli import run_stages
from csd.compose import build_adapter
from csd.errors import ConfigError
from csd.plan import GB, MAX_BATCH, model_shape, plan_memory, preset_configs, resolve_batch_size
from csd.presets import CONF_DIR
from csd.ragged import SlotBatch
from csd.toy.domain import toy_prompts
from csd.validate import validate
from tests.pipeline.test_config import make_cfg

PROMPTS = [p.text for p in toy_prompts(3)]  # in the toy's vocabulary; bytes for the tiny Janus


def cache_bytes(batch: SlotBatch) -> int:
    return sum(t.numel() * t.element_size() for t in batch.cache.keys + batch.cache.values)


@pytest.mark.parametrize("name", [pytest.param("toy", marks=pytest.mark.slow), "janus_pro_tiny", "lumina_mgpt_tiny",
                                  "emu3_tiny", "anole_tiny", pytest.param("toy_draft", marks=pytest.mark.slow)])
def test_plan_matches_the_measured_weights_and_kv_cache(name):
    model = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
    plan = plan_memory(model_shape(model), window=16, compiled=False, device_type="cpu")
    adapter = build_adapter(model, torch.device("cpu"))
    modules = [m for m in vars(adapter).values() if isinstance(m, torch.nn.Module)]  # the model (+ Lumina's VQGAN)
    tensors = {id(t): t for m in modules for t in (*m.parameters(), *m.buffers())}  # submodules held twice count once
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    assert weights == pytest.approx(plan.shape.weight_bytes, rel=0.2)
    slots = len(PROMPTS)
    batch = SlotBatch(adapter, slots)
    for slot, prompt in enumerate(PROMPTS):
        batch.prefill(slot, prompt)
    assert batch.cache.capacity == plan.cache_len
    assert cache_bytes(batch) == pytest.approx(slots * plan.kv_per_slot, rel=0.2)
    table = batch.cache.causal_masks()  # the causal-mask table every forward reads
    assert table.numel() * table.element_size() == plan.mask_table


def test_the_kv_formula_is_rows_length_layers_heads_dim_two_bytes():
    shape = model_shape(OmegaConf.load(CONF_DIR / "model" / "janus_pro_7b.yaml"))
    plan = plan_memory(shape, window=16, compiled=False, device_type="cuda")
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.cfg_rows, shape.dtype_bytes) == (30, 32, 128, 2, 2)
    assert plan.kv_per_slot == 2 * plan.cache_len * 30 * 32 * 128 * 2 * 2
    assert plan.cache_len == 768  # 63 prompt entries + 576 + 64, rounded up to 256


def test_max_batch_is_the_largest_that_fits():
    plan = plan_memory(model_shape(OmegaConf.load(CONF_DIR / "model" / "janus_pro_7b.yaml")), 16, True, "cuda")
    for memory in (24 * GB, 80 * GB, 141 * GB):
        batch = plan.max_batch(memory)
        assert 1 <= batch < MAX_BATCH
        assert plan.total(batch) <= memory < plan.total(batch + 1)
    assert plan.max_batch(plan.shape.weight_bytes) == 0
    assert plan.max_batch(80 * GB) > plan.max_batch(40 * GB) > plan.max_batch(24 * GB)


@pytest.mark.slow
def test_every_preset_has_a_plan():
    for model in preset_configs():
        shape = model_shape(model)
        assert shape.weight_bytes > 0 and shape.body_len > 0, model.name


@pytest.mark.slow
def test_batch_size_auto_takes_the_plan(caplog):
    cfg = make_cfg("model=janus_pro_7b", "engine.batch_size=auto", "engine.memory_gb=40", "device=cpu",
                   "dataset.n_prompts=1000")
    validate(cfg)
    plan = plan_memory(model_shape(cfg.model), cfg.drafter.window, False, "cpu")
    with caplog.at_level("INFO", logger="csd"):
        resolve_batch_size(cfg)
    assert cfg.engine.batch_size == plan.max_batch(40 * GB) > 1
    assert "engine.batch_size=auto ->" in caplog.text


def test_batch_size_auto_is_capped_at_the_runs_images(caplog):
    """A memory that holds thousands of images gives the run's image count (prompts x samples), not a batch of slots
    that would never fill."""
    cfg = make_cfg("model=janus_pro_1b", "engine.batch_size=auto", "engine.memory_gb=100000", "device=cpu",
                   "dataset=smoke", "dataset.n_prompts=3", "dataset.samples_per_prompt=2")
    with caplog.at_level("INFO", logger="csd"):
        resolve_batch_size(cfg)
    assert cfg.engine.batch_size == 6
    assert "the run's 6 images" in caplog.text


def test_batch_size_auto_that_fits_nothing_is_one_line():
    cfg = make_cfg("model=janus_pro_7b", "engine.batch_size=auto", "engine.memory_gb=8", "device=cpu")
    with pytest.raises(ConfigError, match="engine.batch_size=auto: model=janus_pro_7b needs .* GB for one image") as err:
        resolve_batch_size(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("value", "message"), [
    ("0", "engine.batch_size=0 must be 'auto' or an integer >= 1"),
    ("many", "engine.batch_size='many' must be 'auto' or an integer >= 1"),
    ("1.5", "engine.batch_size=1.5 must be 'auto' or an integer >= 1"),
])
def test_bad_batch_sizes_are_one_line(value, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(f"engine.batch_size={value}"))


def test_memory_gb_must_be_positive():
    with pytest.raises(ConfigError, match="engine.memory_gb=0 must be > 0"):
        validate(make_cfg("engine.memory_gb=0"))


@pytest.mark.slow
def test_plan_stage_prints_the_plan(capsys):
    run_stages(make_cfg("stage=plan", "model=janus_pro_7b", "engine.memory_gb=24", "device=cpu"))
    printed = capsys.readouterr().out
    plan = plan_memory(model_shape(OmegaConf.load(CONF_DIR / "model" / "janus_pro_7b.yaml")), 16, False, "cpu")
    assert f"largest engine.batch_size that fits: {plan.max_batch(24 * GB)}" in printed
    assert "2 CFG rows x 768 entries x 30 layers x 32 KV heads x 128 head dim x 2 x 2 B" in printed


def test_an_auto_batch_that_fits_nothing_ends_the_run_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("csd.compose.check_weights", lambda model: None)  # as if the 7B's files were there
    cfg = make_cfg("stage=generate", "model=janus_pro_7b", "engine.batch_size=auto", "engine.memory_gb=8", "device=cpu",
                   f"run_dir={tmp_path / 'run'}")
    with pytest.raises(SystemExit) as exit_:
        run_stages(cfg)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: engine.batch_size=auto: model=janus_pro_7b needs")
    assert not (tmp_path / "run").exists()  # before the run directory or the model


@pytest.mark.slow
def test_the_plan_holds_on_the_real_shape_per_component() -> None:
    """Janus-Pro-1B's shape, one decoder layer, SJD windows of 16 at batch 2 (a fresh interpreter): the held components
    are the plan's to 10 %; the transients (a second prefill, an iteration after the first) stay under it with 10 %
    slack (the plan bounds a forward's activations from above: measured 0.4-0.9 of it, docs/PERFORMANCE.md)."""
    from experiments.bench_memory import measure_fresh

    row = measure_fresh("janus_pro_1b", 1, 2, "sjd", 16, 3)
    planned, measured = row["planned"], row["measured"]
    for held in ("weights", "kv_cache", "mask_table"):
        assert abs(planned[held] / measured[held] - 1) < 0.10, held
    for transient in ("prefill", "iteration"):
        assert 0 < measured[transient] < 1.10 * planned[transient], transient
