"""Issue 13: every config key has a type and range, checked in one table before any model loads."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict

from csd import cli, config
from csd.config import CONF_DIR, ConfigError, build_rule, choices, method_params, validate
from tests.test_config import make_cfg, run_cli

#: the config groups whose every key must have a schema entry
SCHEMA_GROUPS = ("method", "model", "dataset", "engine", "eval", "logger")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["method.lam=abc"], "method.lam='abc' must be a finite number >= 0"),
        (["method=lantern", "method.k=three"], "method.k='three' must be an integer >= 1"),
        (["method=amplify", "method.k=three"], "method.k='three' must be a finite number >= 1"),
        (["dataset.n_prompts=abc"], "dataset.n_prompts='abc' must be an integer >= 1"),
        (["dataset.n_prompts=2.5"], "dataset.n_prompts=2.5 must be an integer >= 1"),
        (["dataset.samples_per_prompt=two"], "dataset.samples_per_prompt='two' must be an integer >= 1"),
        (["model.guidance_scale=abc"], "model.guidance_scale='abc' must be a finite number > 0"),
        (["method.lam=[0.1,0.2]"], r"method.lam=\[0.1, 0.2\] must be a finite number >= 0.*-m method.lam=a,b"),
        (["seed=abc"], "seed='abc' must be an integer >= 0"),
        (["method.window=true"], "method.window=true must be an integer >= 1"),
        (["engine.compile=yes"], "engine.compile='yes' must be true or false"),
        (["engine.warmup=-1"], "engine.warmup=-1 must be an integer >= 0"),
        (["eval.batch_size=0"], "eval.batch_size=0 must be an integer >= 1"),
        (["eval.fid.transforms=[lanczos:abc]"], r"eval.fid.transforms=\['lanczos:abc'\]: image step 'lanczos:abc' needs a size"),
        (["model=janus_pro_tiny", "model.grid=[8,8]"], r"model.grid=\[8, 8\] must be an integer >= 1"),
        (["model=lumina_mgpt_tiny", "model.grid=3"], "model.grid=3 must be a list of 2 integers >= 1"),
        (["model.dtype=fp8"], "model.dtype='fp8' must be one of"),
        (["logger.mode=on"], "logger.mode='on' must be one of"),
        (["dataset.split=test"], "dataset.split='test' must be one of"),
        (["dataset.samples_per_prompt=null"], "dataset.samples_per_prompt=null is not allowed"),
        (["threads=0"], r"threads=0 must be an integer >= 1 \(or null for torch's default\)"),
        (["threads=1.5"], "threads=1.5 must be an integer >= 1"),
        # non-finite numbers
        (["method.lam=inf"], "method.lam=inf must be a finite number >= 0"),
        (["method.delta=nan"], r"method.delta=nan must be a finite number in \[0, 1\]"),
        (["model.temperature=inf"], "model.temperature=inf must be a finite number > 0"),
        # fractional integers and ranges
        (["method=gsd", "method.group_size=3.7"], "method.group_size=3.7 must be an integer >= 0"),
        (["method=lantern", "method.k=2.5"], "method.k=2.5 must be an integer >= 1"),
        (["method=gsd", "method.prob_threshold=5"], r"method.prob_threshold=5 must be in \[0, 1\]"),
        # metric names, before anything is generated
        (["eval.toy.metrics=[speed,foo]"], r"eval.toy.metrics=\['speed', 'foo'\]: unknown metric 'foo'; choose from .*'scene'"),
        (["eval.metrics=[fid,bar]"], "eval.metrics=.*unknown metric 'bar'"),
    ],
)
def test_bad_types_and_ranges_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(make_cfg(*overrides))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["threads=null", "dataset.n_prompts=null", "method.lam=1"],
        ["method=lantern", "method.k=5", "threads=4"],
        ["method=amplify", "method.k=2.5", "model=lumina_mgpt_tiny", "model.grid=[2,3]", "threads=2"],
    ],
)
def test_good_values_of_every_type_pass(overrides):
    validate(make_cfg(*overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["seed=abc"], "error: seed='abc' must be an integer >= 0"),
        (["method.lam=inf"], "error: method.lam=inf must be a finite number >= 0"),
        (["method=lantern", "method.k=2.5"], "error: method.k=2.5 must be an integer >= 1"),
        (["eval.metrics=[foo]"], "error: eval.metrics=['foo']: unknown metric 'foo'"),
    ],
)
def test_cli_prints_one_error_line_before_the_model_loads(tmp_path, overrides, message):
    out = run_cli(*overrides, "model=janus_pro_7b", "stage=generate", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(message) and "Traceback" not in out.stderr
    assert not (tmp_path / "run.json").exists()


def _leaf_keys(node: object, prefix: str) -> list[str]:
    """Dotted keys of a YAML file's values (``defaults`` excluded), a schema key counting as a leaf."""
    keys = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if key == "defaults":
            continue
        if isinstance(value, dict) and path not in config.SCHEMA:
            keys += _leaf_keys(value, path + ".")
        else:
            keys.append(path)
    return keys


def test_every_config_key_has_a_schema_entry():
    files = [(group, p) for group in SCHEMA_GROUPS for p in sorted((CONF_DIR / group).glob("*.yaml"))]
    files.append(("method", CONF_DIR / "method_keys.yaml"))  # the keys every method file pulls in
    missing = []
    for group, path in files:
        data = OmegaConf.to_container(OmegaConf.load(path))
        missing += [f"{path.name}: {k}" for k in _leaf_keys(data, group + ".") if k not in config.SCHEMA]
    top = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    top = {k: v for k, v in top.items() if k != "hydra"}  # nested keys too (dataset.num_shards, status.stale_min)
    missing += [f"config.yaml: {k}" for k in _leaf_keys(top, "") if k not in config.SCHEMA]
    assert not missing
    assert {group for group, _ in files} == set(SCHEMA_GROUPS)  # every group's files were found


def test_per_target_specs_name_real_targets():
    targets = {OmegaConf.load(p).get("_target_") for g in SCHEMA_GROUPS for p in (CONF_DIR / g).glob("*.yaml")}
    for spec in config.SCHEMA.values():
        assert set(getattr(spec, "by", {})) <= targets


def test_metric_names_match_the_registry():
    from csd.evaluation.metrics import METRICS

    assert config.metric_names() == sorted(METRICS)


def test_method_common_is_not_a_method(tmp_path):
    assert "_common" not in choices("method")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        options = GlobalHydra.instance().config_loader().get_group_options("method")
    assert sorted(options) == choices("method") and not any(o.startswith("_") for o in options)
    out = run_cli("method=_common", f"hydra.run.dir={tmp_path}")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "_common" in out.stderr and "sjd" in out.stderr and "lantern" in out.stderr


def test_unknown_keys_are_warned_about_in_one_line(caplog):
    with caplog.at_level(logging.WARNING, logger="csd.config"):
        validate(make_cfg("+foo=1", "+method.bar=2", "+eval.fid.colour=red"))
    unknown = [r.getMessage() for r in caplog.records if "foo" in r.getMessage()]
    assert len(unknown) == 1 and "\n" not in unknown[0]
    assert all(key in unknown[0] for key in ("foo", "method.bar", "eval.fid.colour"))


def test_ignored_method_keys_are_warned_about_once_per_run(caplog):
    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage() and "lam" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="csd.config"):
        cfg = make_cfg("method=sjd", "method.lam=0.3")
        validate(cfg)
        build_rule(cfg.method)
        method_params(cfg.method)
        validate(cfg)  # generate_run validates the config run_stages already validated
        assert len(warnings()) == 1
        validate(make_cfg("method=sjd", "method.lam=0.3"))  # the next job of a multirun: a new run
        assert len(warnings()) == 2


def test_threads_are_set_before_any_stage(tmp_path, monkeypatch):
    assert make_cfg().threads == 1
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    for threads, expected in (("3", [3]), ("null", [])):
        cfg = make_cfg(f"threads={threads}", "stage=evaluate")
        with open_dict(cfg):
            cfg.run_dir = str(tmp_path)  # not a run: the evaluate stage fails after the threads are set
        with pytest.raises(SystemExit):
            cli.run_stages(cfg)
        assert calls == expected
        calls.clear()


def test_empty_prompt_list_says_so(tmp_path):
    empty = tmp_path / "evaluation_metadata.jsonl"
    empty.write_text("\n")
    out = run_cli("dataset=geneval", f"dataset.metadata={empty}", "model=janus_pro_7b", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: {empty}: no prompts")


def test_non_finite_numbers_never_reach_json():
    for value in (math.inf, -math.inf, math.nan):
        cfg = make_cfg("method=addition")
        cfg.method.c = value
        with pytest.raises(ConfigError, match="finite"):
            validate(cfg)

