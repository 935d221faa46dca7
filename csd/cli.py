"""Stage dispatch behind ``run.py``: generate -> evaluate -> report, with short errors for bad input.

The command line is checked in the order that costs least first (:func:`preflight`): a typo needs only the config
files and the key table, so this module imports torch, the plug-ins and the stages where a check or a stage needs
them: a typo or ``--help`` is answered in about a second, without torch.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from csd.errors import INPUT_ERRORS, ConfigError
from csd.keys import SCHEMA, eval_metrics
from csd.overrides import check_overrides, close_names
from csd.presets import CONF_DIR, model_preset
from csd.schema import show

log = logging.getLogger("csd")
#: the config groups that make a run's images (with ``seed``): fixed once it is generated
RUN_GROUPS = ("method", "model", "dataset")
_ABSENT = object()


def in_multirun() -> bool:
    """True inside a Hydra multirun job: the sweep report is built once at the end (SweepReportCallback)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def quiet_open_clip(record: logging.LogRecord) -> bool:
    """Keep open_clip's warnings but not its model-loading INFO lines (it logs them on the root logger)."""
    return record.levelno >= logging.WARNING or f"{os.sep}open_clip{os.sep}" not in record.pathname


def one_gpu_per_shard(cfg: DictConfig) -> None:
    """A shard that sees several GPUs (``CUDA_VISIBLE_DEVICES=0,1,...``, e.g. set by the local_procs
    launcher's ``gpus_per_node``) keeps only the ``shard % n``-th, so local shard processes spread over the
    GPUs. Runs before anything initialises CUDA; an unset variable is left alone (SLURM sets it per job)."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if cfg.dataset.num_shards > 1 and len(visible) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[cfg.dataset.shard % len(visible)]
        log.info("shard %d: CUDA_VISIBLE_DEVICES=%s", cfg.dataset.shard, os.environ["CUDA_VISIBLE_DEVICES"])


#: stages that read a directory which must exist -> the keys that may name it, in the order the stage reads
READS = {"evaluate": ("run_dir",), "report": ("sweep_dir", "run_dir"), "status": ("sweep_dir", "run_dir"),
         "decode": ("sweep_dir", "run_dir")}
#: what the directory named by each key of READS holds
HOLDS = {"run_dir": "a run", "sweep_dir": "a sweep or a run"}


def check_dirs(stage: str, run_dir: str | None, sweep_dir: str | None, run_key: str = "run_dir") -> None:
    """Refuse, in one line, a directory the stage cannot use, before anything is created.

    ``stage=evaluate`` needs ``run_dir`` holding a generated run (its run.json); report and status need
    an existing ``sweep_dir`` or ``run_dir``, decode one that is or holds a generated run; the stages that write
    need a ``run_dir`` that is a directory or does not exist yet, in a directory they can write to. ``run_key`` names the key ``run_dir`` came from (``hydra.run.dir`` given instead).
    """
    given = {"run_dir": run_dir, "sweep_dir": sweep_dir}
    for key, value in given.items():  # '' would be the current directory
        message = SCHEMA[key].error(run_key if key == "run_dir" else key, value)
        if message:
            raise ConfigError(message)
    if stage in READS:
        key = next((k for k in READS[stage] if given[k]), None)
        if key is None:
            raise ConfigError(f"stage={stage} needs " + " or ".join(f"{k}=<dir>" for k in READS[stage]))
        name = f"{run_key if key == 'run_dir' else key}={given[key]}"
        path = Path(given[key])
        if not path.is_dir():
            what = "is a file, not a directory" if path.exists() else "does not exist"
            raise ConfigError(f"{name} {what}; give the directory of {HOLDS[key]}")
        if stage == "evaluate" and not (path / "run.json").exists():
            raise ConfigError(f"{name} is not a generated run directory (no run.json)")
        if stage == "decode" and not (path / "run.json").exists() and next(path.rglob("run.json"), None) is None:
            raise ConfigError(f"{name} is not a generated run directory and holds none (no run.json)")
    elif run_dir:
        path = Path(run_dir)
        blocker = next((p for p in (path, *path.parents) if p.exists()), path)
        where = "" if blocker == path else f": {blocker}"
        if blocker.exists() and not blocker.is_dir():
            raise ConfigError(
                f"{run_key}={run_dir}{where} is a file, not a directory; "
                "give a new directory or a run to resume"
            )
        if blocker.exists() and not writable(blocker):
            raise ConfigError(f"{run_key}={run_dir}{where} is not writable; give a directory you can write to")


def writable(directory: Path) -> bool:
    """Whether files can be made in ``directory``: ``os.access``, then (it says yes to root everywhere, /proc included)
    a probe directory made and removed at once, so nothing is left behind."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".csd-probe-", dir=directory))
    except OSError:
        return False
    return True




def preflight(argv: Sequence[str]) -> None:
    """Every check of a run on ``run.py``'s command line, before Hydra creates its output directory (``.hydra/``,
    ``run.log``) and before any model loads: typos (:func:`csd.overrides.check_overrides`), a command line Hydra cannot
    parse or compose (its error in one line), the directories (:func:`check_dirs`), the config values
    (:func:`csd.validate.validate`) and the inputs (:func:`check_inputs`). Raises one of :data:`INPUT_ERRORS`.

    Hydra's flags (``-m``, ``--cfg``, ...) skip all but the typo check: a multirun's jobs are checked before the first
    is launched (:mod:`csd.sweep`). The job checks again what it composes itself (it may be run without ``run.py``);
    warnings are left to it, so each is logged once.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    check_overrides(argv)
    if any(arg.startswith("-") for arg in argv):
        return
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(argv), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(hydra_error(err, argv)) from None
    hydra_dir = OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"]
    explicit = not str(hydra_dir).startswith("${csd_output_dir:")  # hydra.run.dir given: it is the run
    run_dir = cfg.run_dir if cfg.run_dir is not None else (cfg.hydra.run.dir if explicit else None)
    check_dirs(cfg.stage, run_dir, cfg.sweep_dir, "hydra.run.dir" if explicit and cfg.run_dir is None else "run_dir")
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(cfg)  # csd.presets.config_dirs: the config directories hydra.searchpath adds
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
        cfg.run_dir = run_dir
    from csd.validate import validate

    quiet = logging.getLogger("csd.validate")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        validate(cfg)
        check_inputs(cfg, argv)
    finally:
        quiet.setLevel(level)
        hydra_config.cfg = previous


#: where Hydra's override grammar is described (its parse errors point there)
GRAMMAR_URL = "https://hydra.cc/docs/advanced/override_grammar/basic"


def hydra_error(err: Exception, argv: Sequence[str]) -> str:
    """Hydra's (multi-line) error about ``argv`` in one line that says the fix: an override without a value, one it
    cannot parse (named: its message may not say which), a ``hydra.<key>`` that is not a Hydra setting (the settings
    there), a ``hydra/<group>`` option that does not exist (the options)."""
    from hydra.conf import HydraConf

    text = " ".join(str(err).split())
    if isinstance(err, OverrideParseException):
        parser = OverridesParser.create()
        for arg in argv:
            if arg.startswith("-"):
                continue
            try:
                parser.parse_override(arg)
            except HydraException as bad:  # parse_override raises the grammar's error as a plain HydraException
                if "=" not in arg:
                    return f"{arg}: an override needs a value; write {arg}=<value> (or ~{arg} to delete the key)"
                reason = str(bad).splitlines()[0]
                return (f"{arg}: Hydra cannot parse it ({reason}); quote a value with special characters "
                        f"({arg.split('=')[0]}='<value>'), see {GRAMMAR_URL}")
    if isinstance(err, MissingConfigException) and err.options is not None and err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"{group}={option} is not an option of {group}; choose one of {sorted(err.options)}"
    bad_key = re.match(r"Could not override '(hydra\.[^']+)'", text)
    if bad_key:
        key = bad_key.group(1)
        schema = OmegaConf.create({"hydra": OmegaConf.structured(HydraConf)})
        parts = key.split(".")
        depth = max(n for n in range(1, len(parts)) if isinstance(OmegaConf.select(schema, ".".join(parts[:n])), DictConfig))
        parent, name = ".".join(parts[:depth]), parts[depth]  # the deepest Hydra node the key names, its unknown child
        settings = sorted(OmegaConf.select(schema, parent).keys())
        close = close_names(name, settings)
        hint = f"did you mean {parent}.{close}? " if close else ""
        return (f"{key} is not a Hydra setting: {parent} has no {name}; {hint}its settings: {', '.join(settings)} "
                "(python run.py --cfg hydra shows their values)")
    return text


def check_command_line(argv: Sequence[str]) -> None:
    """:func:`preflight` for ``run.py``: a refused command line ends in one line (``error: ...``, exit 2)."""
    try:
        preflight(argv)
    except INPUT_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def job_overrides() -> list[str]:
    """The command-line overrides of this run (or multirun job); none outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def evaluated_run_config(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The config ``cfg.run_dir`` was generated with (its ``config.yaml``; for a run without one, run.json's names
    and seed), for ``stage=evaluate``. An override of its method, model, dataset or seed that differs from the run
    is a :class:`ConfigError`: evaluate scores the run as it was generated and would silently ignore it."""
    from csd.rundir import read_run_file

    run_dir = Path(cfg.run_dir)
    info_path = run_dir / "run.json"
    if not info_path.exists():
        raise FileNotFoundError(f"{info_path} missing: {run_dir} is not a generated run directory")
    info = read_run_file(info_path)
    path = run_dir / "config.yaml"
    run_config = OmegaConf.load(path) if path.exists() else OmegaConf.create(
        {**{group: {"name": info[group]} for group in RUN_GROUPS}, "seed": info["seed"]})
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key.split(".")[0] not in (*RUN_GROUPS, "seed") or key in ("dataset.num_shards", "dataset.shard"):
            continue
        name = f"{key}.name" if key in RUN_GROUPS else key
        ours, theirs = OmegaConf.select(cfg, name), OmegaConf.select(run_config, name, default=_ABSENT)
        if theirs is not _ABSENT and ours != theirs:
            typed = str if key in RUN_GROUPS else show  # a group's option as typed: method=sjd
            raise ConfigError(f"stage=evaluate: {run_dir} was generated with {key}={typed(theirs)}, not "
                              f"{key}={typed(ours)}; drop {override.input_line} (evaluate scores a run as it was "
                              "generated)")
    return run_config


def check_inputs(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """The checks of a run (or multirun job) beyond its config values (:func:`csd.validate.validate`), still before
    any model loads: the dataset holds ``dataset.n_prompts`` prompts, each one the model reads
    (:func:`csd.compose.check_captions`), within the bounds that count the run's prompts and their captions' length,
    and a window typed on the command line fits the image (:mod:`csd.limits`); the model's files are there
    (:func:`csd.compose.check_weights`, the draft model's too); the JSON files of an existing ``run_dir`` are readable
    (:func:`csd.rundir.check_run_files`), for ``stage=decode`` those of every run it decodes, and their models' files;
    ``stage=evaluate`` reads a run that the command line does not contradict (:func:`evaluated_run_config`); a stage
    that evaluates has metrics its model supports (:func:`csd.keys.eval_metrics`), no published COCO protocol on a
    toy model and, with
    ``eval.strict=true``, every weights and data file its metrics read (:func:`csd.evaluation.metrics.check_files`).
    ``overrides``: the command line's, for the evaluate stage. Also run for every job of a multirun before the
    first starts (:mod:`csd.sweep`)."""
    from csd.compose import build_drafter, check_captions, check_weights, load_prompts
    from csd.limits import caption_problem, config_problem, typed_window_problem
    from csd.rundir import check_run_files

    if cfg.stage in ("generate", "all", "study"):
        prompts = load_prompts(cfg.dataset)  # refuses more prompts than the dataset holds, naming its size
        check_captions(cfg.model, cfg.dataset.name, prompts)
        drafter = build_drafter(cfg.drafter)
        files = [f"dataset.{key}={show(cfg.dataset[key])}" for key in ("metadata", "annotations") if key in cfg.dataset]
        problem = (config_problem(cfg, drafter, len(prompts)) or typed_window_problem(cfg.model, drafter, overrides)
                   or caption_problem(prompts, cfg.model, drafter, files[0] if files else f"dataset={cfg.dataset.name}"))
        if problem:
            raise ConfigError(problem)
        check_weights(cfg.model)
        draft_model = OmegaConf.select(cfg, "drafter.model")  # drafter=draft_model: its own model preset
        if draft_model is not None:
            check_weights(model_preset(draft_model))
    if cfg.stage in ("generate", "all", "study", "evaluate", "status") and cfg.run_dir and Path(cfg.run_dir).is_dir():
        check_run_files(Path(cfg.run_dir))
    if cfg.stage == "decode":  # decodes with each run's own model: its files must be here
        from csd.decode import run_dirs_under, run_model_config

        for run in run_dirs_under(cfg.sweep_dir or cfg.run_dir):
            check_run_files(run)
            check_weights(run_model_config(run))
        return
    if cfg.stage == "evaluate":
        run_config = evaluated_run_config(cfg, overrides)
    elif cfg.stage == "all" and cfg.dataset.num_shards == 1:
        run_config = cfg
    else:
        return
    model, rule = run_config.model.name, cfg.eval.caption_rule
    toy = model in cfg.eval.toy.models
    if rule is not None and toy:
        raise ConfigError(f"eval.protocol={cfg.eval.protocol} was published for COCO prompts "
                          f"(eval.caption_rule={rule}) and real models, but model={model} is scored with the toy CLIP "
                          "and rendered scenes: use eval=default, or set eval.caption_rule=null to apply its settings "
                          "anyway")
    names = eval_metrics(cfg.eval, model)
    if cfg.eval.strict and not toy:  # the toy's CLIP, references and checker ship with it
        from csd.evaluation.metrics import check_files

        check_files(names, cfg.eval, run_config)


def print_stage(cfg: DictConfig, run_dir: Path) -> bool:
    """Run ``stage=plan``, ``status``, ``study`` or ``decode``, whose result is printed; False for the other stages."""
    if cfg.stage == "plan":
        from csd.plan import config_plan, describe_plan

        print(describe_plan(*config_plan(cfg)))
    elif cfg.stage == "status":
        from csd.status import status_table

        print(status_table(Path(cfg.sweep_dir or run_dir), cfg.status.stale_min)[0])
    elif cfg.stage == "study":
        from csd.study import run_study

        print(f"study: {run_study(cfg)}")
    elif cfg.stage == "decode":
        from csd.decode import decode_runs

        target = Path(cfg.sweep_dir or run_dir)
        done = decode_runs(target, None if cfg.device == "auto" else cfg.device, cfg.engine.progress)
        print(f"decode: {sum(d.written for d in done)} images written, {sum(d.kept for d in done)} already there "
              f"({len(done)} run{'s' if len(done) != 1 else ''} in {target})")
    return cfg.stage in ("plan", "status", "study", "decode")


def run_stages(cfg: DictConfig) -> None:
    """Run ``cfg.stage``; configuration and missing-file errors end the run with one clear line.

    A shard of a sharded run (``dataset.num_shards > 1``) with ``stage=all`` only generates: the run is
    evaluated once, over every shard, with ``stage=evaluate`` when all are done.
    """
    logging.getLogger().addFilter(quiet_open_clip)
    run_key = "hydra.run.dir" if cfg.run_dir is None else "run_dir"  # the key that names the run on the command line
    if cfg.run_dir is None:  # run.py's Hydra output directory: a new run's, or the run_dir/sweep_dir given
        from hydra.core.hydra_config import HydraConfig

        cfg.run_dir = HydraConfig.get().runtime.output_dir
    import torch

    from csd.hub import without_loading_bars
    from csd.validate import validate

    try:
        validate(cfg)
        one_gpu_per_shard(cfg)  # before anything asks CUDA for memory (engine.batch_size=auto's plan)
        if cfg.stage not in ("status", "report", "plan"):  # the stages that load a model (evaluate: CLIP's too)
            without_loading_bars()
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        check_dirs(cfg.stage, cfg.run_dir, cfg.sweep_dir)
        check_inputs(cfg, job_overrides())
        run_dir = Path(cfg.run_dir)
        if cfg.stage in ("generate", "all", "study"):  # the stages that decode: engine.batch_size=auto -> the plan's
            from csd.plan import resolve_batch_size

            resolve_batch_size(cfg)
        if print_stage(cfg, run_dir):
            return
        sharded = cfg.dataset.num_shards > 1
        if cfg.stage in ("generate", "all"):
            from csd.pipeline import generate_run

            generate_run(cfg)
        if cfg.stage == "all" and sharded:
            log.info("shard %d of %d done; evaluate the run with stage=evaluate run_dir=%s once every shard is",
                     cfg.dataset.shard, cfg.dataset.num_shards, run_dir)
        elif cfg.stage in ("evaluate", "all"):
            from csd.evaluate import evaluate_run

            evaluate_run(run_dir, cfg)
        if cfg.stage == "report" or (cfg.stage == "all" and not in_multirun() and not sharded):
            report_stage(cfg, Path(cfg.sweep_dir) if cfg.stage == "report" and cfg.sweep_dir else run_dir)
    except INPUT_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as err:  # one line, not a traceback; 130 = 128 + SIGINT
        print(f"interrupted: {interrupted_message(cfg, str(err), run_key=run_key)}", file=sys.stderr)
        raise SystemExit(130) from None


def report_stage(cfg: DictConfig, target: Path) -> None:
    """Build the report of ``target`` (a sweep or a run) and print its compact tables (the full ones: its files)."""
    import pandas as pd

    from csd.report import build_report
    from csd.report.table import console_tables

    report = build_report(target, cfg)
    print(console_tables(pd.read_csv(report / "runs.csv"), report))
    print(f"report: {report}")


def interrupted_message(cfg: DictConfig, saved: str, multirun: bool | None = None, run_key: str = "hydra.run.dir") -> str:
    """What Ctrl-C left (``saved``: the generate stage's "N of M images saved in <dir>") and how to go on.
    ``multirun``: whether ``cfg`` is a multirun job's (None: ask Hydra, as the job itself does; the submitting
    process of a sweep says so: hydra_plugins/csd_launcher). ``run_key``: the key that names the run's directory on
    the command line to repeat (``run_dir`` when the run was given one)."""
    if cfg.stage == "report":
        return "the report was not finished; run the same command again"
    run_dir = Path(cfg.run_dir)
    kept = saved or f"finished images are kept in {run_dir}"
    shards = OmegaConf.select(cfg, "dataset.num_shards", default=1)
    if shards > 1:  # one shard of a run: rerun just that shard into the run's directory
        return (f"{kept}; to resume this shard, run it alone with run_dir={run_dir} "
                f"dataset.num_shards={shards} dataset.shard={cfg.dataset.shard}")
    # a multirun job's directory is <sweep dir>/<job>, recreated by rerunning the sweep into the same sweep dir
    if multirun is None:
        multirun = in_multirun()
    again = f"hydra.sweep.dir={run_dir.parent}" if multirun else f"{run_key}={run_dir}"
    return f"{kept}; to resume, run the same command with {again}"
