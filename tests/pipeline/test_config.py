"""Hydra configs compose, bad values fail early with the allowed values, runs resume, multiruns work."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from csd.compose import adapter_class, build_drafter, build_rule, method_params
from csd.errors import ConfigError
from csd.pipeline import generate_run
from csd.presets import CONF_DIR, choices, model_preset
from csd.records import RECORDS_FILE, load_records
from csd.validate import validate

ROOT = Path(__file__).resolve().parents[2]


def make_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    with open_dict(cfg):
        cfg.run_dir = "unused"
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("method", choices("method"))
@pytest.mark.parametrize("model", choices("model"))
def test_every_method_and_model_composes_and_validates(method, model):
    class_ids = model_preset(model).get("kind") == "c2i"  # a class-conditional model takes class-id prompts
    cfg = make_cfg(f"method={method}", f"model={model}", *["dataset=imagenet_classes"] * class_ids)
    problem = build_drafter(cfg.drafter).model_problem(adapter_class(cfg.model))
    if problem is not None:  # a drafter some models cannot take (ssd, eagle_sd: features, trained heads): one line
        with pytest.raises(ConfigError, match=re.escape(problem)):
            validate(cfg)
        return
    validate(cfg)
    assert cfg.method.name == method and cfg.model.name == model
    for key in ("window", "init", "coupling", "lam", "delta", "k", "c"):  # sweepable over every method
        assert key in cfg.method


def test_method_configs_build_their_rules():
    assert build_rule(make_cfg("method=csd", "method.lam=0.3").method).params()["lam"] == 0.3
    assert build_rule(make_cfg("method=lantern").method).params() == {"neighbours": 1000, "budget": 0.1}
    assert build_rule(make_cfg("method=sjd", "method.lam=0.3").method).params() == {}  # ignored, warned


def test_paper_variants_override_their_base_method():
    gsd = make_cfg("method=gsd_g25").method
    assert build_rule(gsd).params()["group_size"] == 25 and gsd._target_ == make_cfg("method=gsd").method._target_
    assert build_rule(make_cfg("method=amplify_k4").method).params() == {"factor": 4.0}
    mcsjd = make_cfg("method=mcsjd")
    assert (mcsjd.drafter.window, mcsjd.drafter.coupling, mcsjd.method.name) == (64, "maximal", "mcsjd")
    assert make_cfg("method=sjd_l32").drafter.window == 32
    pac = make_cfg("method=csd_pac")
    assert (pac.drafter.name, pac.drafter.width, pac.method._target_) == ("pac_tree", 4, "csd.acceptance.CSD")
    assert make_cfg("method=csd_pac", "drafter=chain").drafter.name == "chain"  # the command line chooses last


def test_renamed_rule_keys_keep_working_with_one_warning(caplog):
    """LANTERN's ``k``/``delta`` are ``neighbours``/``budget`` and Amplify's ``k`` is ``factor`` (distinct names for
    distinct meanings; CSD keeps ``lam`` and ``delta``); the old names still set them, with a warning."""
    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        cfg = make_cfg("method=lantern", "method.k=64", "method.delta=0.3")
        validate(cfg)
    assert build_rule(cfg.method).params() == {"neighbours": 64, "budget": 0.3}
    assert any("method.k, method.delta renamed; use method.neighbours, method.budget" in r.getMessage()
               for r in caplog.records)
    amplify = make_cfg("method=amplify", "method.k=5")
    validate(amplify)
    assert build_rule(amplify.method).params() == {"factor": 5.0}
    csd = make_cfg("method=csd", "method.delta=0.3")  # CSD's delta is its own name
    validate(csd)
    assert build_rule(csd.method).params()["delta"] == 0.3
    with pytest.raises(ConfigError, match=r"method.budget=2 must be in \[0, 1\]"):
        validate(make_cfg("method=lantern", "method.budget=2"))


def test_method_files_give_their_rules_declared_defaults():
    """A rule's parameters are declared once, in its class (csd.params): a base method file sets each to its declared
    default or leaves it null (the default; presets set their own values) and sets nothing the class does not
    declare; a drafter file sets every declared parameter to its default."""
    from hydra.utils import get_class

    from csd.keys import SHARED_METHOD_KEYS

    for name in choices("method"):
        cfg = make_cfg(f"method={name}")
        cls = get_class(cfg.method._target_)
        own = {k: v for k, v in cfg.method.items() if k not in ("name", "_target_") and v is not None}
        assert set(own) <= set(cls.PARAMS), (name, set(own) - set(cls.PARAMS))
        assert set(SHARED_METHOD_KEYS) >= set(cls.PARAMS), (name, "a shared key per parameter, to sweep it across methods")
        text = (CONF_DIR / "method" / f"{name}.yaml").read_text()
        if "/method_keys@" in text:  # a base file, not a preset; null (unset) is the declared default
            assert all(own.get(k, p.default) == p.default for k, p in cls.PARAMS.items()), name
    for name in choices("drafter"):
        cfg = make_cfg(f"drafter={name}")
        cls = get_class(cfg.drafter._target_)
        own = {k: v for k, v in cfg.drafter.items() if k not in ("name", "_target_")}
        assert own == {k: p.default for k, p in cls.PARAMS.items()}, name


def test_deprecated_method_drafting_keys_move_to_the_drafter_with_one_warning(caplog):
    """``method.window`` & co. keep working for one release: they set the drafter's keys (a tree width switches to
    ``drafter=pac_tree`` with the chain's other settings, as the method keys decoded before the drafter group)."""
    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        cfg = make_cfg("method=mcsjd", "method.window=32")
        validate(cfg)
    assert (cfg.drafter.window, cfg.drafter.coupling, cfg.method.window) == (32, "maximal", None)
    assert any("method.window deprecated" in r.getMessage() and "drafter.window" in r.getMessage() for r in caplog.records)
    tree = make_cfg("method=sjd", "method.window=21", "method.tree_width=4", "method.tree_depth=3")
    validate(tree)
    assert (tree.drafter.name, tree.drafter.width, tree.drafter.depth, tree.drafter.coupling) == ("pac_tree", 4, 3, "none")
    assert method_params(tree) == {"window": 21, "init": "random", "coupling": "none", "draft_record": "onehot",
                                   "tree_width": 4, "tree_depth": 3, "pac_code_parity": False}
    chain = make_cfg("method=sjd_pac", "method.tree_width=1")
    validate(chain)
    assert chain.drafter.name == "chain" and build_drafter(chain.drafter).params() == {
        "window": 64, "init": "random", "coupling": "maximal", "draft_record": "uniform"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["method.lam=-0.1"], "method.lam=-0.1 must be >= 0"),
        (["method.delta=1.5"], r"method.delta=1.5 must be in \[0, 1\]"),
        (["method.window=0"], "method.window=0"),
        (["drafter.window=0"], "drafter.window=0 must be an integer >= 1"),
        (["method=ar", "drafter.window=4"], "method=ar needs drafter.window=1"),
        (["method.init=zeros"], "random"),
        (["method.coupling=gumble"], "gumbel"),
        (["method.draft_record=gauss"], "onehot"),
        (["drafter.draft_record=uniform", "drafter.init=repeat_left"], "records the law of init=random drafts"),
        (["model.top_k=0"], "model.top_k=0 must be an integer >= 1"),
        (["model.guidance_scale=0"], "guidance_scale=0 must be > 0"),
        (["model.temperature=-1"], "temperature=-1"),
        (["method.entropy_norm=bits"], "log_vocab"),
        (["method=amplify", "method.k=0.5"], "method.k=0.5 must be >= 1"),
        (["method=amplify", "method.factor=0.5"], "method.factor=0.5 must be >= 1"),
        (["stage=train"], "generate"),
        (["device=tpu"], "cpu"),
        (["method=ssd_r1", "drafter.rounds=3"], r"drafter.rounds=3 must be one of \[0, 1, 2\]"),
        (["method=ssd_r1", "drafter.k_v=3"], "drafter.k_v=3"),
    ],
)
def test_bad_values_are_rejected_with_the_allowed_ones(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(*overrides))


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_unknown_choice_points_to_the_valid_ones(tmp_path):
    """25 methods: the line says where they are (conf/method/) instead of listing them all."""
    out = run_cli("method=nope", f"hydra.run.dir={tmp_path}")
    assert out.returncode != 0
    assert "method='nope': choose one of the" in out.stderr and "options in conf/method/ (" in out.stderr


@pytest.mark.slow
def test_bad_value_fails_before_any_model_loads(tmp_path):
    out = run_cli("method.lam=-1", "model=janus_pro_7b", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert "method.lam=-1" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_missing_weights_give_a_short_error(tmp_path):
    out = run_cli("model=janus_pro_7b", "model.path=/nonexistent/janus", "stage=generate", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert "hf download deepseek-community/Janus-Pro-7B --local-dir" in out.stderr and "Traceback" not in out.stderr


def test_generate_writes_records_and_resumes(tmp_path):
    cfg = make_cfg("model=janus_pro_tiny", "dataset=smoke", "dataset.n_prompts=2", "method=csd", "engine.progress=false")
    with open_dict(cfg):
        cfg.run_dir = str(tmp_path)
    generate_run(cfg)
    records = load_records(tmp_path)
    assert [r["prompt_id"] for r in records] == ["smoke-000", "smoke-001"]
    rec = records[0]
    assert rec["method_params"] == {
        "window": 16, "init": "random", "coupling": "none", "draft_record": "onehot", "lam": 0.1, "delta": 0.5,
        "entropy_norm": "none",
    }
    assert len(rec["tokens"]) == len(rec["commit_iter"]) == len(rec["commit_kind"]) == 64
    assert rec["step_compression"] == pytest.approx(64 / rec["nfe"])
    assert (tmp_path / rec["image"]).exists() and (tmp_path / "config.yaml").exists()
    assert json.loads((tmp_path / "run.json").read_text())["model_info"]["grid"] == [8, 8]

    # a crash mid-write leaves a partial line: it is dropped, finished images are kept and not redone
    path = tmp_path / RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    with open_dict(cfg):
        cfg.dataset.n_prompts = 3  # a longer prompt list extends the run (a shorter or other one is refused)
    generate_run(cfg)
    again = load_records(tmp_path)
    assert [r["prompt_id"] for r in again] == ["smoke-000", "smoke-001", "smoke-002"]
    assert again[0] == records[0]
    assert again[1]["tokens"] == records[1]["tokens"]  # same seed -> same image when redone
    mtime = path.stat().st_mtime_ns
    generate_run(cfg)  # nothing left to do
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_multirun_sweeps_two_jobs(tmp_path):
    out = run_cli(
        "-m", "stage=generate", "model=janus_pro_tiny", "dataset=smoke", "dataset.n_prompts=1",
        "method=sjd,csd", "method.lam=0.2", "engine.progress=false", f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    runs = sorted(p.parent for p in tmp_path.glob("*/records.jsonl"))
    assert [json.loads((r / "run.json").read_text())["method"] for r in runs] == ["sjd", "csd"]
    assert load_records(runs[1])[0]["method_params"]["lam"] == 0.2


@pytest.mark.slow
def test_multirun_validates_every_job_before_the_first_starts(tmp_path):
    out = run_cli(
        "-m", "stage=generate", "model=janus_pro_tiny", "dataset=smoke", "dataset.n_prompts=2", "method=ar,sjd_pac",
        "engine.batch_size=2", "engine.progress=false", "logger=disabled", f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert errors[0].startswith("error: job #1 (stage=generate model=janus_pro_tiny dataset=smoke dataset.n_prompts=2 "
                                "method=sjd_pac engine.batch_size=2")
    assert "set engine.batch_size=1, got 2" in errors[0]
    assert not list(tmp_path.rglob("records*.jsonl"))  # AR did not run either


def test_a_problem_of_several_jobs_is_one_line_naming_them():
    from csd.sweep import problem_lines

    found = [(0, ["method=sjd", "model=x"], "files not found"), (1, ["method=csd", "model=x"], "files not found"),
             (2, ["method=ar", "model=x"], "other"), (3, ["method=ar", "model=x", "seed=1"], "files not found")]
    assert problem_lines(found) == [
        "jobs #0, #1, #3 (model=x; #0 method=sjd, #1 method=csd, #3 method=ar seed=1): files not found",
        "job #2 (method=ar model=x): other",
    ]


def test_sweep_jobs_expand_like_hydras_basic_sweeper():
    from hydra.core.global_hydra import GlobalHydra

    from csd.sweep import job_config, sweep_jobs

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        sweep = compose("config", ["experiment=toy_paper", "seed=1"], return_hydra_config=True)
        sweep.hydra.overrides.task = ["experiment=toy_paper", "method.lam=0.1,0.2", "seed=1"]  # as -m gives it
        jobs = sweep_jobs(sweep)
        assert len(jobs) == 24 and jobs[:2] == [["method=ar", "experiment=toy_paper", "method.lam=0.1", "seed=1"],
                                                ["method=ar", "experiment=toy_paper", "method.lam=0.2", "seed=1"]]
        cfg = job_config(GlobalHydra.instance().config_loader(), sweep, jobs[-1], 23)
    assert (cfg.method.name, cfg.method.lam, cfg.seed, cfg.dataset.n_prompts) == ("csd_pac", 0.2, 1, 400)
    assert "hydra" not in cfg and cfg.run_dir.endswith("23_csd_pac")


def test_strict_checks_the_metric_files_before_generating(tmp_path, monkeypatch, capsys):
    from csd import cli
    from tests.pipeline.test_rundir import no_model_load, tiny_cfg

    no_model_load(monkeypatch)
    for overrides, message in (
        (["eval.metrics=[speed,clip_score]", "eval.clip.pretrained=/nonexistent/open_clip.bin"],
         "error: CLIP weights file '/nonexistent/open_clip.bin' not found"),
        (["eval.metrics=[speed,fid]", "eval.fid.reference_dir=/nonexistent/val2017"],
         "error: FID reference images not found at '/nonexistent/val2017'"),
    ):
        cfg = tiny_cfg(tmp_path / "run", "eval.strict=true", "stage=all", *overrides)
        with pytest.raises(SystemExit) as exit_:
            cli.run_stages(cfg)
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith(message)
        assert not (tmp_path / "run" / RECORDS_FILE).exists()


def test_models_keeps_one_adapter_and_its_compiled_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """``csd.compose.Models``: the same model config gives the kept adapter, another one replaces it (the old one
    dropped before the new one loads); one compiled step per compile setting of the kept adapter, none eager."""
    import torch

    from csd import compose

    built: list[tuple[str, object]] = []

    def fake_build(model, device):
        built.append((model.name, device))
        return object()  # a stand-in: Models only keeps it

    monkeypatch.setattr(compose, "build_adapter", fake_build)
    made: list[tuple] = []
    monkeypatch.setattr(compose, "compiled_step", lambda adapter, engine: made.append((adapter, engine.compile_backend))
                        or (object() if engine.compile else None))
    models, cpu = compose.Models(), torch.device("cpu")
    toy, janus = make_cfg("model=toy"), make_cfg("model=janus_pro_tiny")
    first = models.adapter(toy.model, cpu)
    assert models.adapter(make_cfg("model=toy").model, cpu) is first and len(built) == 1
    eager = make_cfg("model=toy").engine
    assert models.compiled(first, eager) is None
    compiled = make_cfg("model=toy", "engine.compile=true", "engine.compile_backend=aot_eager").engine
    step = models.compiled(first, compiled)
    assert step is not None and models.compiled(first, compiled) is step
    assert [backend for _, backend in made] == ["inductor", "aot_eager"]  # the eager setting asked once, kept nothing
    other = models.adapter(janus.model, cpu)
    assert other is not first and [name for name, _ in built] == ["toy", "janus_pro_tiny"]
    with pytest.raises(ValueError, match="not the kept one"):
        models.compiled(first, compiled)
    assert models.compiled(other, compiled) is not step
