"""Issue 13: every config key has a type and range, checked in one table before any model loads."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from omegaconf import OmegaConf, open_dict

from csd import cli, compose, deprecations, keys, registry
from csd import overrides as override_checks
from csd import validate as validation
from csd.compose import build_rule, method_params
from csd.errors import ConfigError
from csd.limits import usable_cores
from csd.presets import CONF_DIR, choices
from csd.validate import validate
from tests.pipeline.test_config import make_cfg, run_cli

#: the config groups whose every key must have a schema entry
SCHEMA_GROUPS = ("method", "drafter", "model", "dataset", "engine", "eval", "logger")


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
        (["drafter.window=true"], "drafter.window=true must be an integer >= 1"),
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
        (["method=gsd", "method.group_size=3.7"], "method.group_size=3.7 must be an integer >= 2"),
        (["method=gsd", "method.group_size=0"], "method.group_size=0 must be an integer >= 2"),
        # a speculative method with one-token windows is AR under another name
        (["method=sjd", "drafter.window=1"], "method=sjd with drafter.window=1 decodes exactly like method=ar"),
        (["method=lantern", "method.k=2.5"], "method.k=2.5 must be an integer >= 1"),
        (["method=gsd", "method.prob_threshold=5"], r"method.prob_threshold=5 must be in \[0, 1\]"),
        # metric names, before anything is generated
        (["eval.toy.metrics=[speed,foo]"], r"eval.toy.metrics=\['speed', 'foo'\]: unknown metric 'foo'; choose from .*'scene'"),
        (["eval.metrics=[fid,bar]"], "eval.metrics=.*unknown metric 'bar'"),
        # a deleted method key would silently become the rule's default
        (["~method.lam"], r"method.lam is missing \(~method.lam deletes it\); method=csd reads it: give it a value "
                          r"\(method.lam=<value>\)"),
        (["method=gsd", "~method.group_size"], r"method.group_size is missing \(~method.group_size deletes it\); "
                                               "method=gsd reads it"),
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
        ["method=lantern", "method.k=5", "threads=1"],
        ["method=amplify", "method.k=2.5", "model=lumina_mgpt_tiny", "model.grid=[2,3]", "threads=1"],
    ],
)
def test_good_values_of_every_type_pass(overrides):
    validate(make_cfg(*overrides))


@pytest.mark.slow
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
    found = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if key == "defaults":
            continue
        if isinstance(value, dict) and path not in keys.SCHEMA:
            found += _leaf_keys(value, path + ".")
        else:
            found.append(path)
    return found


def test_every_config_key_has_a_schema_entry():
    """Every key of conf/ has a spec: a SCHEMA entry, or (a rule's or drafter's own key) its class's declaration;
    the shared method keys are each declared by some rule, or are a deprecated or renamed name."""
    files = [(group, p) for group in SCHEMA_GROUPS for p in sorted((CONF_DIR / group).glob("*.yaml"))]
    missing = []
    for group, path in files:
        if group in ("method", "drafter"):  # checked as composed: the class's declarations
            cfg = make_cfg(f"{group}={path.stem}")
            missing += [f"{path.name}: {key}" for key, _ in validation._leaves(cfg[group], f"{group}.")
                        if key not in keys.SCHEMA and validation.declared_spec(cfg, key) is None
                        and key[7:] not in keys.SHARED_METHOD_KEYS]
            continue
        data = OmegaConf.to_container(OmegaConf.load(path))
        missing += [f"{path.name}: {k}" for k in _leaf_keys(data, group + ".") if k not in keys.SCHEMA]
    rules = [get_class(make_cfg(f"method={m}").method._target_) for m in choices("method")]
    used = {k for cls in rules for k in (*cls.PARAMS, *cls.renamed)} | set(deprecations.MOVED_TO_DRAFTER)
    missing += [f"method_keys.yaml: {k} (no rule declares it)" for k in keys.SHARED_METHOD_KEYS if k not in used]
    top = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    top = {k: v for k, v in top.items() if k != "hydra"}  # nested keys too (dataset.num_shards, status.stale_min)
    missing += [f"config.yaml: {k}" for k in _leaf_keys(top, "") if k not in keys.SCHEMA]
    assert not missing
    assert {group for group, _ in files} == set(SCHEMA_GROUPS)  # every group's files were found


def test_per_target_specs_name_real_targets():
    targets = {OmegaConf.load(p).get("_target_") for g in SCHEMA_GROUPS for p in (CONF_DIR / g).glob("*.yaml")}
    for spec in keys.SCHEMA.values():
        assert set(getattr(spec, "by", {})) <= targets


def test_every_registered_metric_resolves():
    """The registry names a function for each metric, imported only when used."""
    from csd.registry import METRICS, metric

    assert registry.metric_names() == sorted(METRICS)
    assert all(callable(metric(name)) for name in METRICS)
    with pytest.raises(KeyError, match="unknown metric 'bleu'"):
        metric("bleu")


@pytest.mark.slow
def test_method_common_is_not_a_method(tmp_path):
    assert "_common" not in choices("method")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        options = GlobalHydra.instance().config_loader().get_group_options("method")
    assert sorted(options) == choices("method") and not any(o.startswith("_") for o in options)
    out = run_cli("method=_common", f"hydra.run.dir={tmp_path}")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "_common" in out.stderr and "conf/method/" in out.stderr


def test_unknown_keys_are_warned_about_in_one_line(caplog):
    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        validate(make_cfg("+foo=1", "+method.bar=2", "+eval.fid.colour=red"))
    unknown = [r.getMessage() for r in caplog.records if "foo" in r.getMessage()]
    assert len(unknown) == 1 and "\n" not in unknown[0]
    assert all(key in unknown[0] for key in ("foo", "method.bar", "eval.fid.colour"))


def test_ignored_method_keys_are_warned_about_once_per_run(caplog):
    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage() and "lam" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        cfg = make_cfg("method=sjd", "method.lam=0.3")
        validate(cfg)
        build_rule(cfg.method)
        method_params(cfg)
        validate(cfg)  # generate_run validates the config run_stages already validated
        assert len(warnings()) == 1
        validate(make_cfg("method=sjd", "method.lam=0.3"))  # the next job of a multirun: a new run
        assert len(warnings()) == 2


def test_threads_are_set_before_any_stage(tmp_path, monkeypatch):
    assert make_cfg().threads == 1
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    cores = usable_cores()  # more threads than cores are refused (csd.limits)
    for threads, expected in ((str(cores), [cores]), ("null", [])):
        cfg = make_cfg(f"threads={threads}", "stage=evaluate")
        with open_dict(cfg):
            cfg.run_dir = str(tmp_path)  # not a run: the evaluate stage fails after the threads are set
        with pytest.raises(SystemExit):
            cli.run_stages(cfg)
        assert calls == expected
        calls.clear()


@pytest.mark.slow
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



# --- typos: a "did you mean" from the schema, before Hydra composes anything


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["method.lamm=0.1"], r"^method\.lamm is not a config key; did you mean method\.lam\? \(to add a new key on "
                              r"purpose: \+method\.lamm=0\.1\)$"),
        (["metod=csd"], r"^metod is not a config key or group; did you mean method\?"),
        (["-m", "method=sjd,cds"], r"^method='cds': did you mean csd\?$"),
        # the close match alone; a family's members; else where the choices are, not 20-40 names
        (["model=toyy"], r"^model='toyy': did you mean toy\?$"),
        (["model=janus_pro_7"], r"^model='janus_pro_7': did you mean janus_pro_7b\?$"),
        (["experiment=toy_papr"], r"^experiment='toy_papr': did you mean toy_paper\?$"),
        (["model=llamagen"], r"^model='llamagen' names a family: choose one of llamagen_c2i_b, llamagen_c2i_l, "
                             r"llamagen_c2i_tiny, llamagen_c2i_xl, llamagen_t2i, llamagen_t2i_256, llamagen_t2i_tiny$"),
        (["model=zzz"], r"^model='zzz': choose one of the \d+ options in conf/model/ \(anole_7b, anole_tiny, emu3_gen, "
                        r"\.\.\.\)$"),
        (["eval.fid.pairde=false"], r"did you mean eval\.fid\.paired\?"),
        (["model=janus_pro_tiny", "model.gird=8"], r"^model\.gird is not a config key; did you mean model\.grid\?"),
    ],
)
def test_typos_are_refused_with_the_closest_known_names(args, message):
    with pytest.raises(ConfigError, match=message) as err:
        override_checks.check_overrides(args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "method=ar,sjd", "method.lam=0.1,0.2", "dataset.shard=range(2)", "hydra/launcher=local_procs"],
        ["+foo=1", "++method.bar=2", "~logger", "hydra.run.dir=/tmp/x", "experiment=toy_paper", "--cfg", "job"],
        ["study.rules.a.knob=lam", "model.entropy_temperature={t0: 1}", "eval.toy.only_if.position=relation_asked"],
        ["eval.fid={paired: false}", "experiment=null", "method=ar", "run_dir=x"],
    ],
)
def test_valid_command_lines_pass_the_typo_check(args):
    override_checks.check_overrides(args)


@pytest.mark.slow
def test_a_typo_on_the_command_line_is_one_line_instead_of_hydras_hint(tmp_path):
    out = run_cli("method.lamm=0.1", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: method.lamm is not a config key; did you mean method.lam? "
                                  "(to add a new key on purpose: +method.lamm=0.1)")


def test_unknown_added_keys_are_warned_about_with_the_closest_key(caplog):
    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        validate(make_cfg("+method.lamm=0.1"))
    assert any("method.lamm (did you mean method.lam?)" in r.getMessage() for r in caplog.records)


# --- small bad inputs, each one line before any model loads


def test_more_prompts_than_the_toy_split_holds_are_refused_before_building_them():
    with pytest.raises(ConfigError, match=r"^dataset\.n_prompts=20000, but dataset=toy has 10000 prompts per split"):
        compose.load_prompts(make_cfg("dataset.n_prompts=20000").dataset)
    assert len(compose.load_prompts(make_cfg("dataset.n_prompts=10000").dataset)) == 10000


def test_a_published_protocol_on_the_toy_is_refused():
    cfg = make_cfg("eval=sjd_protocol")
    with pytest.raises(ConfigError, match=r"eval\.protocol=sjd was published for COCO prompts.*model=toy"):
        cli.check_inputs(cfg, [])
    cli.check_inputs(make_cfg("eval=sjd_protocol", "eval.caption_rule=null"), [])  # on purpose: allowed
    cli.check_inputs(make_cfg("eval=sjd_protocol", "stage=generate"), [])  # nothing is evaluated


def test_evaluate_refuses_overrides_that_differ_from_the_run(tmp_path):
    from tests.evaluation.test_eval_fixtures import make_run

    run = make_run(tmp_path / "r", "csd", method_params={"lam": 0.1, "delta": 0.5})
    for overrides, message in ((["method=sjd"], "generated with method=csd, not method=sjd"),
                               (["method.lam=0.3"], "generated with method.lam=0.1, not method.lam=0.3")):
        cfg = make_cfg("stage=evaluate", *overrides)
        cfg.run_dir = str(run)
        with pytest.raises(ConfigError, match=rf"^stage=evaluate: {run} was {message}; drop"):
            cli.check_inputs(cfg, ["stage=evaluate", *overrides])
    cfg = make_cfg("stage=evaluate", "method=csd", "method.lam=0.1")  # the run's own values: fine
    cfg.run_dir = str(run)
    cli.check_inputs(cfg, ["stage=evaluate", "method=csd", "method.lam=0.1"])


@pytest.mark.slow
def test_evaluate_with_another_method_is_one_cli_line(tmp_path):
    from tests.evaluation.test_eval_fixtures import make_run

    run = make_run(tmp_path / "r", "csd", method_params={"lam": 0.1, "delta": 0.5})
    out = run_cli("stage=evaluate", f"run_dir={run}", "method=sjd", "logger=disabled")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "generated with method=csd, not method=sjd" in out.stderr and not (run / "metrics.json").exists()


def test_max_cache_len_without_compile_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        validate(make_cfg("engine.max_cache_len=10"))
    assert any("engine.max_cache_len=10" in r.getMessage() and "engine.compile=true" in r.getMessage()
               for r in caplog.records)


# --- eval.metrics chooses the metrics of every model


def test_eval_metrics_default_per_model_and_chosen_for_every_model():
    assert keys.eval_metrics(make_cfg().eval, "toy") == ["speed", "content", "clip_score", "fid", "scene", "regions"]
    assert keys.eval_metrics(make_cfg().eval, "janus_pro_7b") == ["speed", "content", "clip_score", "fid"]
    for model in ("toy", "janus_pro_7b"):
        assert keys.eval_metrics(make_cfg("eval.metrics=[speed,fid]").eval, model) == ["speed", "fid"]


def test_a_toy_metric_for_another_model_is_one_line():
    with pytest.raises(ConfigError, match=r"^eval\.metrics=\['speed', 'scene'\]: model=janus_pro_7b has no 'scene' "
                                          r"metric \(the toy's only"):
        keys.eval_metrics(make_cfg("eval.metrics=[speed,scene]").eval, "janus_pro_7b")
    with pytest.raises(ConfigError, match="model=janus_pro_tiny has no 'regions' metric"):
        cli.check_inputs(make_cfg("model=janus_pro_tiny", "eval.metrics=[regions]"), [])


def test_the_old_toy_metrics_key_still_works_with_a_deprecation_line(caplog):
    cfg = make_cfg("eval.toy.metrics=[speed]")
    with caplog.at_level(logging.WARNING, logger="csd.validate"):
        validate(cfg)
    assert any("eval.toy.metrics is deprecated: use eval.metrics" in r.getMessage() for r in caplog.records)
    assert keys.eval_metrics(cfg.eval, "toy") == ["speed"]
    assert keys.eval_metrics(cfg.eval, "janus_pro_7b") == ["speed", "content", "clip_score", "fid"]
    with pytest.raises(ConfigError, match="set only eval.metrics"):
        keys.eval_metrics(make_cfg("eval.toy.metrics=[speed]", "eval.metrics=[fid]").eval, "toy")


def test_eval_metrics_are_honoured_for_the_toy(tmp_path):
    from csd.evaluate import evaluate_run
    from tests.evaluation.test_eval_fixtures import eval_cfg, make_run

    run = make_run(tmp_path / "r", "csd", method_params={"lam": 0.1, "delta": 0.5})
    result = evaluate_run(run, eval_cfg(tmp_path, **{"eval.metrics": ["speed"]}))
    assert "latency_mean" in result["metrics"]
    assert not any(k.startswith(("clip", "fid", "scene")) for k in result["metrics"])


# --- what only the built model tells, before its first image


def test_a_window_longer_than_the_image_is_one_line_refused_when_compiled_or_typed(tmp_path, caplog, monkeypatch):
    """A preset's window longer than the image is logged and decodes as the image's length; compiled (every window
    padded to it) or typed on the command line (the value would only be relabelled), it is refused, naming the setting
    as typed (``drafter.gamma`` for a draft model)."""
    from csd.pipeline import generate_run
    from csd.records import load_records
    from tests.pipeline.test_rundir import tiny_cfg

    with caplog.at_level(logging.WARNING, logger="csd.pipeline"):
        generate_run(tiny_cfg(tmp_path / "long", "dataset.n_prompts=1", "drafter.window=100"))
    lines = [r.getMessage() for r in caplog.records if "drafter.window=100" in r.getMessage()]
    assert lines == ["drafter.window=100 is longer than model=janus_pro_tiny's image (64 tokens): a window holds at "
                     "most the tokens left to decode, so this run decodes as with windows of 64 entries (set "
                     "drafter.window <= 64 to say so)"]
    generate_run(tiny_cfg(tmp_path / "64", "dataset.n_prompts=1", "drafter.window=64"))
    assert load_records(tmp_path / "long")[0]["tokens"] == load_records(tmp_path / "64")[0]["tokens"]
    compiled = tiny_cfg(tmp_path / "compiled", "dataset.n_prompts=1", "drafter.window=100", "engine.compile=true")
    with pytest.raises(ConfigError, match=r"^drafter\.window=100 is longer than model=janus_pro_tiny's image \(64 "
                                          r"tokens\) and engine\.compile=true pads every window to its length: set "
                                          r"drafter\.window <= 64$"):
        generate_run(compiled)
    assert not (tmp_path / "compiled" / "records.jsonl").exists()
    monkeypatch.chdir(tmp_path)
    tiny = ["model=janus_pro_tiny", "dataset=smoke"]
    with pytest.raises(ConfigError, match=r"^drafter\.window=65 is longer than model=janus_pro_tiny's image \(64 "
                                          r"tokens\): a window holds at most the tokens left to decode; set "
                                          r"drafter\.window <= 64$"):
        cli.preflight([*tiny, "drafter.window=65"])
    draft = [*tiny, "drafter=draft_model", "drafter.model=janus_pro_tiny"]
    with pytest.raises(ConfigError, match=r"^drafter\.gamma=64 drafts windows of 65 entries .*set drafter\.gamma <= 63$"):
        cli.preflight([*draft, "drafter.gamma=64"])
    cli.preflight([*draft, "drafter.gamma=63"])
    cli.preflight([*tiny, "method=sjd_l32"])  # a preset's window of 32 on an image of 64 tokens


def test_a_compiled_cache_shorter_than_a_prompt_is_one_line_before_decoding(tmp_path):
    from csd.pipeline import generate_run
    from tests.pipeline.test_rundir import tiny_cfg

    cfg = tiny_cfg(tmp_path, "dataset.n_prompts=2", "engine.compile=true", "engine.max_cache_len=40")
    with pytest.raises(ConfigError, match=r"^engine\.max_cache_len=40 is too small for prompt smoke-00\d \(\d+ cache "
                                          r"entries, the image's 64 and a window of 16\): set engine\.max_cache_len >= \d+"):
        generate_run(cfg)
    assert not (tmp_path / "records.jsonl").exists()


def test_a_plan_needs_no_prompts_so_a_class_conditional_model_needs_no_class_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli.preflight(["stage=plan", "model=llamagen_c2i_b"])  # the default dataset holds captions: no prompts are read
    with pytest.raises(ConfigError, match="use dataset=imagenet_classes"):
        cli.preflight(["stage=generate", "model=llamagen_c2i_tiny"])


def test_every_model_that_reads_files_has_a_weights_check():
    """What makes a sweep refuse missing weights before its first job (csd.compose.check_weights): every preset that
    names files (``model.path``, a checkpoint) has its loader's check registered."""
    from hydra.utils import get_method

    from csd.adapters.base import WEIGHTS_CHECKS

    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        preset = OmegaConf.load(path)
        get_method(preset._target_)
        assert ("path" in preset) == (preset._target_ in WEIGHTS_CHECKS), path.name


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="a machine with a GPU runs device=cuda")
def test_cuda_without_a_gpu_is_one_line_before_the_model_loads():
    with pytest.raises(ConfigError, match="device=cuda:1 but no CUDA device is available; use device=cpu or device=auto"):
        validate(make_cfg("device=cuda:1"))


def test_validation_does_not_initialise_cuda(monkeypatch):
    """torch.cuda.is_available() initialises the driver (cuInit), after which a shard can no longer pick its GPU by
    CUDA_VISIBLE_DEVICES (csd.cli.one_gpu_per_shard): the checks before a run ask NVML (torch.cuda.device_count)."""
    def initialises() -> bool:
        raise AssertionError("torch.cuda.is_available() called before the shard picks its GPU")

    monkeypatch.setattr(torch.cuda, "is_available", initialises)
    validate(make_cfg("engine.batch_size=2", "dataset.n_prompts=2", "model=janus_pro_tiny"))
    validate(make_cfg("device=auto", "engine.batch_size=4", "dataset.n_prompts=4"))
