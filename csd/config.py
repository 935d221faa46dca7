"""Config validation and builders: every bad value is reported, with the allowed ones, before any model loads.

Every key of ``conf/`` has an entry in :data:`SCHEMA` (a test enforces it); :func:`validate` checks
each value of the composed config against it and warns about keys nothing reads.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import typing
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.utils import get_class, get_method
from omegaconf import DictConfig, OmegaConf, open_dict

from csd.acceptance import AcceptanceRule
from csd.adapters.base import WEIGHTS_CHECKS, EntropyTemperature, ModelAdapter
from csd.drafters import COUPLINGS, DRAFT_RECORDS, INIT_SCHEMES, Drafter
from csd.evaluation.images import step_error
from csd.fast import CompiledStep
from csd.hub import without_loading_bars
from csd.limits import config_problem
from csd.params import current_names
from csd.prompts import Prompt
from csd.schema import (
    Bool,
    ByTarget,
    Choice,
    Device,
    Fields,
    Float,
    FloatList,
    Group,
    Int,
    IntList,
    IntOrWord,
    MapOf,
    Scalars,
    Spec,
    Str,
    StrList,
    StrMap,
    show,
)

log = logging.getLogger(__name__)
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
STAGES = ("generate", "evaluate", "report", "status", "study", "plan", "decode", "all")
#: the drafting keys that moved from the method to the drafter group (deprecated under ``method.``): old -> new name
MOVED_TO_DRAFTER = {"window": "window", "init": "init", "coupling": "coupling", "draft_record": "draft_record",
                    "tree_width": "width", "tree_depth": "depth", "pac_code_parity": "code_parity"}
#: the tree drafter's own keys (``drafter=pac_tree``)
TREE_KEYS = ("width", "depth", "code_parity")
#: method keys that are not hyper-parameters of the acceptance rule
ENGINE_KEYS = ("name", "_target_", *MOVED_TO_DRAFTER)


class ConfigError(ValueError):
    """A config value is invalid; the message names it and the allowed values."""


def config_dirs() -> list[Path]:
    """``conf/`` and, inside a Hydra app, the directories ``hydra.searchpath`` adds (a rule or drafter of one's own:
    its YAML file there, its module importable)."""
    from hydra.core.hydra_config import HydraConfig

    dirs = [CONF_DIR]
    if HydraConfig.initialized():
        dirs += [Path(s.path) for s in HydraConfig.get().runtime.config_sources
                 if s.schema == "file" and Path(s.path) != CONF_DIR]
    return dirs


def choices(group: str) -> list[str]:
    """The options of a config group (the files in ``<config dir>/<group>/``)."""
    return sorted({p.stem for d in config_dirs() for p in (d / group).glob("*.yaml")})


def metric_names() -> list[str]:
    """The registered metric names (``csd.evaluation.registry``, which imports no metric)."""
    from csd.evaluation.registry import METRICS

    return sorted(METRICS)


#: what null means for a key every method carries but only some use (method_keys.yaml)
UNSET = "for the method's default"
#: the keys every method file carries (conf/method_keys.yaml): null unless the chosen rule uses them
SHARED_METHOD_KEYS = tuple(OmegaConf.load(CONF_DIR / "method_keys.yaml"))
#: what null means for the deprecated drafting keys of method_keys.yaml
MOVED = "for the drafter's value (deprecated key: use drafter.<key>)"

#: ``engine.compile_backend``: torch.compile backends of the compiled step (``aot_eager``/``eager`` trace only)
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")

#: ``dataset.caption_rule`` of COCO captions (the keys of ``csd.data.coco.CAPTION_RULES``, which imports this module)
CAPTION_RULES = ("longest", "sjd", "lantern")

#: every key of ``conf/``: ``group.key`` (nested: ``eval.fid.paired``) -> its allowed values
SCHEMA: dict[str, Spec | ByTarget] = {
    # conf/config.yaml
    "stage": Choice(options=STAGES),
    "seed": Int(min=0),
    "device": Device(),
    "threads": Int(min=1, null="for torch's default"),
    "run_dir": Str(null="for a new run directory", blank=False),
    "sweep_dir": Str(null="", blank=False),
    "status.stale_min": Float(gt=0),
    # stage=study (csd/study.py, docs/EVALUATION.md#matched-compression-study)
    "study.rules": MapOf(
        value=Fields(fields={"method": Group(group="method", options=choices), "knob": Str(), "lo": Float(min=0),
                             "hi": Float(min=0), "increasing": Bool(), "log_scale": Bool(), "overrides": Scalars()}),
        what="rule label",
    ),
    "study.targets": FloatList(gt=1),
    "study.calibration_prompts": Int(min=1),
    "study.tol": Float(gt=0),
    "study.max_evals": Int(min=2),
    # conf/method_keys.yaml, conf/method/*.yaml
    "method.name": Group(group="method", options=choices),
    "method._target_": Str(),
    # deprecated (the drafter group's keys, MOVED_TO_DRAFTER): null = unset
    "method.window": Int(min=1, null=MOVED),
    "method.init": Choice(options=INIT_SCHEMES, null=MOVED),
    "method.coupling": Choice(options=COUPLINGS, null=MOVED),
    "method.draft_record": Choice(options=DRAFT_RECORDS, null=MOVED),
    "method.tree_width": Int(min=1, null=MOVED),
    "method.tree_depth": Int(min=1, null=MOVED),
    "method.pac_code_parity": Bool(null=MOVED),
    # the rule's own keys: its class's declarations (csd.params, declared_spec)
    # conf/drafter/*.yaml
    "drafter.name": Group(group="drafter", options=choices),
    "drafter._target_": Str(),
    # the drafter's own keys: its class's declarations (csd.params, declared_spec)
    # conf/model/*.yaml
    "model.name": Group(group="model", options=choices),
    "model._target_": Str(),
    "model.path": Str(),
    "model.dtype": Choice(options=("float32", "bfloat16", "float16")),
    "model.guidance_scale": Float(gt=0),
    "model.top_k": Int(min=1, null="for no top-k"),
    "model.temperature": Float(gt=0),
    "model.entropy_temperature": Fields(
        fields={"t0": Float(min=0), "alpha": Float(gt=0), "theta": Float(min=0), "lo": Float(gt=0), "hi": Float(gt=0)},
        null="for off; the released Lumina-mGPT values: {t0: 1.5, alpha: 2.5, theta: 0.7, lo: 0.7, hi: 2.0}",
    ),
    "model.random_init": Bool(),
    "model.grid": ByTarget(IntList(length=2, min=1), {"csd.adapters.janus.tiny_janus_adapter": Int(min=1),
                                                      "csd.adapters.llamagen.tiny_llamagen_adapter": Int(min=1)}),
    "model.codebook": Int(min=1),
    "model.codes": Int(min=1),
    "model.seed": Int(min=0),
    "model.head_scale": Float(gt=0),
    "model.vqgan_config": Str(),
    "model.vqgan_ckpt": Str(),
    "model.resolution": Int(min=16),
    "model.jacobi_tail": Int(min=0),
    "model.layers": Int(min=1),
    "model.ratio": Str(),
    "model.image_area": Int(min=1),
    "model.positive_suffix": Str(),
    # LlamaGen (csd/adapters/llamagen.py)
    "model.kind": Choice(options=("c2i", "t2i")),
    "model.gpt_model": Choice(options=("GPT-B", "GPT-L", "GPT-XL")),
    "model.image_size": Int(min=16),
    "model.gpt_ckpt": Str(),
    "model.vq_ckpt": Str(),
    "model.t5": Str(),
    "model.negative_prompt": Str(),
    # conf/dataset/*.yaml
    "dataset.name": Group(group="dataset", options=choices),
    "dataset._target_": Str(),
    "dataset.annotations": Str(),
    "dataset.metadata": Str(),
    "dataset.n_prompts": Int(min=1, null="for all prompts"),
    "dataset.samples_per_prompt": Int(min=1),
    "dataset.fid_reference": Str(null="for none"),
    "dataset.split": Choice(options=("heldout", "train")),
    "dataset.num_shards": Int(min=1),
    "dataset.shard": Int(min=0),
    "dataset.caption_rule": Choice(options=CAPTION_RULES),
    # conf/engine/*.yaml
    "engine.compile": Bool(),
    "engine.compile_backend": Choice(options=COMPILE_BACKENDS),
    "engine.max_cache_len": Int(min=1, null="for prompt + body + 64"),
    "engine.progress": Bool(),
    "engine.warmup": Int(min=0),
    "engine.batch_size": IntOrWord(min=1, word="auto"),
    "engine.memory_gb": Float(gt=0, null="for the free memory of the device (CPU: the available RAM)"),
    "engine.latency_probe": Int(min=0),
    # conf/eval/*.yaml
    "eval.metrics": StrList(names=metric_names, what="metric", null="for the model's own list"),
    "eval.strict": Bool(),
    "eval.allow_partial": Bool(),
    "eval.batch_size": Int(min=1),
    "eval.protocol": Str(),
    "eval.caption_rule": Choice(options=CAPTION_RULES, null="for any"),
    "eval.bootstrap": Int(min=0),
    "eval.clip.model": Str(),
    "eval.clip.pretrained": Str(),
    "eval.clip.model_config": Str(null=""),
    "eval.clip.transforms": StrList(check=step_error),
    "eval.clip.prefix": Str(),
    "eval.clip.scale": Float(gt=0),
    "eval.clip.clamp": Choice(options=("image", "mean", "none")),
    "eval.fid.reference_dir": Str(null="for dataset.fid_reference"),
    "eval.fid.reference_stats": Str(null="for reference images"),
    "eval.fid.paired": Bool(),
    "eval.fid.transforms": StrList(check=step_error),
    "eval.fid.feature": Choice(options=(64, 192, 768, 2048)),
    "eval.fid.inception_weights": Str(null=""),
    "eval.fid.cache_dir": Str(),
    "eval.content.entropy_bins": Int(min=1),
    "eval.toy.models": StrList(),
    "eval.toy.metrics": StrList(names=metric_names, what="metric", null=""),  # deprecated: eval.metrics
    "eval.toy.render": Str(),
    "eval.toy.scene_key": Str(null=""),
    "eval.toy.categories": StrList(),
    "eval.toy.only_if": StrMap(),
    "eval.report.out_dir": Str(null=""),
    "eval.report.extra_runs": StrList(),
    "eval.report.pareto_x": StrList(),
    "eval.report.pareto_y": StrList(),
    "eval.geneval.detector": Str(),
    "eval.geneval.clip_model": Str(),
    "eval.geneval.clip_pretrained": Str(),
    "eval.geneval.threshold": Float(min=0, max=1),
    "eval.geneval.counting_threshold": Float(min=0, max=1),
    "eval.geneval.max_objects": Int(min=1),
    "eval.geneval.position_threshold": Float(min=0),
    # conf/logger/*.yaml
    "logger.name": Group(group="logger", options=choices),
    "logger.mode": Choice(options=("offline", "online", "disabled")),
    "logger.project": Str(),
    "logger.entity": Str(null=""),
    "logger.group": Str(null=""),
    "logger.tags": StrList(),
    "logger.dir": Str(null=""),
    "logger.max_images": Int(min=0),
}


#: ``eval.metrics=null``: the metrics of every model, and those of the toy models only (``eval.toy.models``: the
#: scene checker and the region analysis need the toy's scene specs and segmenter)
DEFAULT_METRICS = ("speed", "content", "clip_score", "fid")
TOY_METRICS = ("scene", "regions")


def eval_metrics(eval_cfg: DictConfig, model: str) -> list[str]:
    """The metrics the evaluate stage computes for a run of ``model``: ``eval.metrics``, for every model.

    ``eval.metrics=null`` (the default) is the model's own list: :data:`DEFAULT_METRICS`, plus :data:`TOY_METRICS`
    for a toy model. A toy-only metric asked of another model, or a metric the toy cannot compute asked of a toy model
    (``geneval`` scores GenEval prompts, which no toy model takes), is a :class:`ConfigError`. The deprecated
    ``eval.toy.metrics`` (which chose the toy's metrics while ``eval.metrics`` was ignored for it) still stands in
    for ``eval.metrics`` on toy models when ``eval.metrics`` is null; :func:`validate` warns about it.
    """
    toy = model in eval_cfg.toy.models
    names = eval_cfg.metrics
    old = OmegaConf.select(eval_cfg, "toy.metrics")
    if old is not None and names is not None:
        raise ConfigError(f"eval.toy.metrics={show(old)} and eval.metrics={show(names)}: eval.metrics now "
                          "chooses the metrics of every model (the toy's too); set only eval.metrics")
    if names is None and old is not None and toy:
        names = old
    if names is None:
        return [*DEFAULT_METRICS, *TOY_METRICS] if toy else list(DEFAULT_METRICS)
    if toy:
        unsupported = [n for n in names if n not in (*DEFAULT_METRICS, *TOY_METRICS)]
        if unsupported:
            raise ConfigError(f"eval.metrics={show(names)}: model={model} has no {unsupported[0]!r} metric (a toy model "
                              f"is scored with {[*DEFAULT_METRICS, *TOY_METRICS]}); drop it")
    unsupported = [n for n in names if n in TOY_METRICS and not toy]
    if unsupported:
        raise ConfigError(f"eval.metrics={show(names)}: model={model} has no {unsupported[0]!r} metric (the toy's "
                          f"only, eval.toy.models={show(eval_cfg.toy.models)}); drop it")
    return list(names)


def config_groups() -> list[str]:
    """The config groups a command line chooses from (``conf/<group>/``; ``hydra/...`` is Hydra's own)."""
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def nullable_groups() -> list[str]:
    """The config groups ``conf/config.yaml`` chooses nothing from by default (``experiment: null``): the only ones
    ``<group>=null`` may name (Hydra fails on any other with a traceback)."""
    return [group for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults if isinstance(entry, DictConfig)
            for group, option in entry.items() if option is None]


def known_keys(dirs: Sequence[Path] = (CONF_DIR,)) -> list[str]:
    """:data:`SCHEMA`'s keys, the shared method keys and every key of a method or drafter file in ``dirs`` (its
    class's declared parameters)."""
    keys = set(SCHEMA) | {f"method.{k}" for k in SHARED_METHOD_KEYS}
    for conf in dirs:
        for group in ("method", "drafter"):
            for path in (conf / group).glob("*.yaml"):
                node = OmegaConf.load(path)
                node = node.get(group, {}) if path.read_text().startswith("# @package _global_") else node
                keys |= {f"{group}.{k}" for k in node if k != "defaults"}
    return sorted(keys)


def known_key(key: str, keys: Sequence[str]) -> bool:
    """Whether ``key`` is one of ``keys``, inside one that holds a mapping (``study.rules.<label>.knob``,
    ``model.entropy_temperature.t0``) or above some (``eval.fid``)."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in keys)


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbouring characters that turn ``a`` into ``b``
    (optimal string alignment: ``lamm`` -> ``lam`` 1, ``cds`` -> ``csd`` 1)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def close_names(name: str, known: Sequence[str]) -> str:
    """The names of ``known`` closest to ``name`` (fewest edits, at most one per four characters, two named at
    most), as ``"a"`` or ``"a or b"``; ``""`` if none is that close."""
    distances = {k: edit_distance(name, k) for k in known}
    best = min(distances.values(), default=0)
    if not distances or best > max(1, len(name) // 4):
        return ""
    return " or ".join(sorted(k for k, v in distances.items() if v == best)[:2])


#: the config groups every run reads (``logger`` may be deleted: no tracking; ``experiment`` is null by default)
RUN_READS = ("method", "drafter", "model", "dataset", "eval")


def check_overrides(args: Sequence[str]) -> None:
    """Refuse a command-line override of a key or config group that does not exist, or a group option that does
    not, in one line with the closest known names, before Hydra composes anything (its own message suggests
    ``+key=...``, which would add the typo as a new key); and any key given twice (Hydra would keep the last).
    ``~`` deleting a group or a key every run reads is refused (the run would fail on the missing key); other
    ``+``/``++``/``~`` overrides, Hydra's own keys and flags are left to Hydra, and so is anything it cannot parse."""
    parser = OverridesParser.create()
    groups = config_groups()
    overrides = []
    for arg in args:
        deleted = arg.removeprefix("~").split("=")[0] if arg.startswith("~") else None
        required = deleted in SCHEMA or deleted in RUN_READS
        if deleted and deleted.split("/")[0].split(".")[0] != "hydra" and required:
            what = "config group" if deleted in groups else "key"
            raise ConfigError(f"{arg} deletes the {what} {deleted}, which every run reads; give it a value instead "
                              f"({deleted}=<value>{', or null where allowed' if what == 'key' else ''})")
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            overrides.append((arg, parser.parse_override(arg)))
        except HydraException:  # the grammar's errors (a plain HydraException, or OverrideParseException): Hydra's own
            continue
    # hydra.searchpath=[file://<dir>, ...] adds config directories (a rule or drafter of one's own)
    dirs = [CONF_DIR] + [Path(str(path).removeprefix("file://")) for _, o in overrides if o.key_or_group == "hydra.searchpath"
                         for path in (o.value() or []) if str(path).startswith("file://")]
    keys = known_keys(dirs)
    nullable = nullable_groups()
    given: dict[str, str] = {}
    for arg, override in overrides:
        key = override.key_or_group
        if key in given:
            raise ConfigError(f"{key} is given twice ({given[key]}, {arg}): Hydra would silently keep the last; give it "
                              "once")
        given[key] = arg
        if (override.is_add() or override.is_force_add() or override.is_delete() or override.package is not None
                or key.split("/")[0].split(".")[0] == "hydra"):
            continue
        if key in groups:
            if override.is_sweep_override() and not override.is_discrete_sweep():
                continue
            options = sorted({p.stem for d in dirs for p in (d / key).glob("*.yaml")})
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
            for value in values:
                if value is None and key not in nullable:
                    raise ConfigError(f"{key}=null: a run needs a {key}; choose one of {options}")
                if value is not None and value not in options:
                    close = close_names(str(value), options)
                    hint = f"did you mean {close}? " if close else ""
                    raise ConfigError(f"{key}={show(value)}: {hint}choose one of {options}")
        elif not known_key(key, keys):
            close = close_names(key, [*keys, *groups])
            what = "a config key or group" if "." not in key else "a config key"
            raise ConfigError(f"{key} is not {what}{f'; did you mean {close}?' if close else ''} "
                              f"(to add a new key on purpose: +{arg})")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _leaves(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value of the config; a schema key is a leaf even if it holds a mapping."""
    for key in node:
        path, value = f"{prefix}{key}", node[key]
        if isinstance(value, DictConfig) and path not in SCHEMA:
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def _rule_params(method: DictConfig) -> tuple[type[AcceptanceRule], dict[str, Any], list[str]]:
    """The rule class, the (non-null) hyper-parameters it declares and the set keys it ignores."""
    cls = get_class(method._target_)
    params, ignored = {}, []
    for key, value in method.items():
        if key in ENGINE_KEYS or value is None:
            continue
        if key in cls.PARAMS:
            params[key] = value
        else:
            ignored.append(key)
    return cls, params, sorted(ignored)


#: configs already warned about: cli.run_stages and generate_run validate the same object (id -> weak ref)
_warned: dict[int, weakref.ref] = {}


def _warn_once(cfg: DictConfig, messages: list[str]) -> None:
    """Log ``messages`` the first time ``cfg`` (this object: one run, one multirun job) is validated."""
    key = id(cfg)
    ref = _warned.get(key)
    if ref is not None and ref() is cfg:
        return
    _warned[key] = weakref.ref(cfg, lambda _: _warned.pop(key, None))
    for message in messages:
        log.warning(message)


def declared_spec(cfg: DictConfig, key: str) -> Spec | None:
    """The spec of a rule's or drafter's own key (``method.lam``, ``drafter.width``; a renamed one's old name) from its
    class's declaration (``csd.params``); a rule's key may be null (its default). None when the class does not
    declare it."""
    group, _, name = key.partition(".")
    if group not in ("method", "drafter") or "." in name:
        return None
    cls = get_class(cfg[group]._target_)
    param = cls.PARAMS.get(cls.renamed.get(name, name))  # an old name is checked as the parameter it names
    if param is None:
        return None
    return dataclasses.replace(param.spec, null=UNSET) if group == "method" and param.spec.null is None else param.spec


def _check_schema(cfg: DictConfig) -> list[str]:
    """Check every value against :data:`SCHEMA` or its class's declaration (a :class:`ConfigError` for the first bad
    one); returns the keys nothing reads (a method key another rule uses, or a renamed one, is read: see
    :func:`move_deprecated_keys` and the ignored-key warning)."""
    unknown = []
    for key, value in _leaves(cfg):
        spec = SCHEMA.get(key) or declared_spec(cfg, key)
        if spec is None:
            if not (key.startswith("method.") and key[7:] in SHARED_METHOD_KEYS):
                unknown.append(key)
            continue
        if isinstance(spec, ByTarget):
            spec = spec.pick(OmegaConf.select(cfg, f"{key.split('.')[0]}._target_"))
        message = spec.error(key, value)
        if message:
            raise ConfigError(message)
    return unknown


def validate(cfg: DictConfig) -> None:
    """Check every value against :data:`SCHEMA` and the rule's and drafter's declarations, then the cross-key rules
    and their own checks; once, where a run starts (``run.py``, the notebook API, each multirun job).

    Raises :class:`ConfigError` (one line: the value and what is allowed); warns once per config about keys nothing
    reads, method keys the chosen method ignores and deprecated names. Deprecated ``method.<drafting key>`` values
    and a rule's renamed keys are moved to their current place first (:func:`move_deprecated_keys`).
    """
    unknown = _check_schema(cfg)
    moved = move_deprecated_keys(cfg)
    if moved:
        _check_schema(cfg)
    _cross_checks(cfg)
    _warn_once(cfg, [*moved, *_warnings(cfg, unknown)])


def _cross_checks(cfg: DictConfig) -> None:
    """The checks across keys, and the rule's and drafter's own, before any model loads."""
    m, d, drafter = cfg.method, cfg.dataset, build_drafter(cfg.drafter)
    problem = drafter.method_problem(m.name)
    _check(problem is None, str(problem))
    _check(d.shard < d.num_shards, f"dataset.shard={d.shard} must be < dataset.num_shards={d.num_shards}")
    # device_count asks NVML, so CUDA is not initialised before a shard picks its GPU (csd.cli.one_gpu_per_shard)
    _check(not cfg.device.startswith("cuda") or torch.cuda.device_count() > 0,
           f"device={cfg.device} but no CUDA device is available; use device=cpu or device=auto")
    auto = cfg.engine.batch_size == "auto"  # the plan may choose any batch: the drafter must take B > 1
    problem = drafter.problem(2 if auto else cfg.engine.batch_size, cfg.engine.compile)
    _check(problem is None, f"engine.batch_size=auto may choose a batch > 1, but {problem}" if auto else str(problem))
    _check_draft_model(cfg)
    problem = drafter.model_problem(adapter_class(cfg.model))
    _check(problem is None, str(problem))
    _check(not cfg.engine.compile or adapter_class(cfg.model).compilable,
           f"engine.compile=true: model={cfg.model.name} has no compiled path; use engine.compile=false")
    rule = OmegaConf.select(cfg, "eval.caption_rule")
    _check(rule is None or cfg.stage not in ("generate", "all") or d.get("caption_rule", rule) == rule,
           f"eval.protocol={OmegaConf.select(cfg, 'eval.protocol')} was published on COCO prompts chosen by "
           f"dataset.caption_rule={rule}, but dataset.caption_rule={d.get('caption_rule')}; set "
           f"dataset.caption_rule={rule}, or eval.caption_rule=null to apply its metrics to these prompts")
    _check_class_prompts(cfg)
    build_rule(m)
    entropy_temperature(cfg.model)
    problem = config_problem(cfg, drafter)
    _check(problem is None, str(problem))


#: the loader of ``dataset=imagenet_classes``: its prompts are class ids, the only prompts a class-conditional model takes
CLASS_ID_PROMPTS = "csd.data.imagenet.imagenet_class_prompts"


def _check_class_prompts(cfg: DictConfig) -> None:
    """A class-conditional model (``model.kind=c2i``) takes class ids, which only a class-id dataset holds, and a
    captioned model takes no class ids; ``stage=plan`` reads no prompts (a memory plan needs the model's shape only)."""
    if cfg.stage == "plan":
        return
    c2i, ids = cfg.model.get("kind") == "c2i", cfg.dataset._target_ == CLASS_ID_PROMPTS
    _check(not c2i or ids, f"model={cfg.model.name} is class-conditional: its prompts are ImageNet class ids, but "
           f"dataset={cfg.dataset.name} holds captions; use dataset=imagenet_classes")
    _check(c2i or not ids, f"dataset={cfg.dataset.name} holds class ids, but model={cfg.model.name} takes captions; "
           "use a class-conditional model (model=llamagen_c2i_b, _l, _xl or _tiny)")


def model_preset(name: str) -> DictConfig:
    """The model preset ``name`` (``<config dir>/model/<name>.yaml``)."""
    return OmegaConf.load(next(d / "model" / f"{name}.yaml" for d in config_dirs() if (d / "model" / f"{name}.yaml").exists()))


def _check_draft_model(cfg: DictConfig) -> None:
    """A drafter with a model of its own (``drafter.model``, a model preset: ``drafter=draft_model``) needs one of
    the target's family (its adapter class: the same token ids and body layout); the vocabulary itself is checked
    when both are loaded (``csd.drafters.draft_model``)."""
    preset = OmegaConf.select(cfg, "drafter.model")
    if preset is None:
        return
    target = adapter_class(cfg.model)
    if adapter_class(model_preset(preset)) is not target:
        same = [name for name in choices("model") if adapter_class(model_preset(name)) is target]
        raise ConfigError(f"drafter.model={preset} is not a {target.__name__} like model={cfg.model.name}: a draft model "
                          f"shares the target's image vocabulary and body layout; choose one of {same}")


def load_draft_adapter(preset: str, target: ModelAdapter) -> ModelAdapter:
    """``drafter.model``'s adapter: the model preset ``preset`` on the target's device, with the target's sampling
    settings in place of its own (guidance, top-k, temperatures: the draft law is the target's processing of the draft
    model's logits, docs/ALGORITHMS.md "Draft model")."""
    model = model_preset(preset)
    sampling = target.sampling
    model.merge_with({"guidance_scale": sampling.guidance_scale, "top_k": sampling.top_k or None,
                      "temperature": sampling.temperature, "entropy_temperature": None})
    adapter = build_adapter(model, target.device)
    adapter.sampling = dataclasses.replace(adapter.sampling, entropy_temperature=sampling.entropy_temperature)
    return adapter


def _warnings(cfg: DictConfig, unknown: list[str]) -> list[str]:
    """Keys nothing reads, settings that have no effect, deprecated keys."""
    warnings = []
    if unknown:
        keys = known_keys()
        named = [f"{key} (not a key of drafter={cfg.drafter.name})" if key in keys and key.startswith("drafter.")
                 else f"{key} (did you mean {close}?)" if (close := close_names(key, keys)) else key for key in unknown]
        warnings.append(f"ignoring config key(s) that csd-bench does not read: {', '.join(named)}")
    if cfg.engine.max_cache_len is not None and not cfg.engine.compile:
        warnings.append(f"ignoring engine.max_cache_len={cfg.engine.max_cache_len}: it sizes the fixed cache of "
                        "engine.compile=true; the eager cache grows with each prompt")
    if OmegaConf.select(cfg, "eval.toy.metrics") is not None:
        warnings.append("eval.toy.metrics is deprecated: use eval.metrics, which now chooses the metrics of every "
                        "model (the toy's too); eval.toy.metrics stands in for it on toy models while it is null")
    ignored = _rule_params(cfg.method)[2]
    if ignored:
        warnings.append(f"method={cfg.method.name} has no parameter(s) {ignored}; ignoring them")
    return warnings


def build_rule(method: DictConfig) -> AcceptanceRule:
    """The acceptance rule of ``method`` with the hyper-parameters it accepts (others are ignored)."""
    cls, params, _ = _rule_params(method)
    try:
        return cls(**params)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def entropy_temperature(model: DictConfig) -> EntropyTemperature | None:
    """``model.entropy_temperature`` (None: off) as the processor's parameters; ``lo > hi`` is a :class:`ConfigError`."""
    params = model.get("entropy_temperature")
    if params is None:
        return None
    try:
        return EntropyTemperature(**OmegaConf.to_container(params))
    except ValueError as err:
        raise ConfigError(f"model.entropy_temperature={OmegaConf.to_container(params)}: {err}") from err


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(device)


def adapter_class(model: DictConfig) -> type[ModelAdapter]:
    """The adapter class ``model._target_`` (a loader function) returns, from its return annotation: what the model
    supports (``compilable``) is known before any weight loads."""
    return typing.get_type_hints(get_method(model._target_))["return"]


def loader_params(model: DictConfig) -> dict[str, Any]:
    """The keyword arguments of the model's loader (``model._target_``): its config values but the name and what
    :func:`build_adapter` applies itself."""
    params = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items()
              if k not in ("name", "_target_", "entropy_temperature")}
    params["top_k"] = params.get("top_k") or 0
    return params


def check_weights(model: DictConfig) -> None:
    """Raise the ``MissingWeightsError`` the model's loader would (its registered check:
    ``csd.adapters.base.WEIGHTS_CHECKS``), without loading anything; a loader without a check (the toy, the tiny
    models) needs no files."""
    get_method(model._target_)  # imports the loader's module, which registers its check
    check = WEIGHTS_CHECKS.get(model._target_)
    if check is not None:
        check(**loader_params(model))


def build_adapter(model: DictConfig, device: torch.device) -> ModelAdapter:
    """The model's loader with its config values (without transformers' "Loading weights" bar)."""
    without_loading_bars()
    adapter = get_method(model._target_)(**loader_params(model), device=str(device))
    tempered = entropy_temperature(model)
    if tempered is not None:  # part of the target q, which the engine's processors build from adapter.sampling
        adapter.sampling = dataclasses.replace(adapter.sampling, entropy_temperature=tempered)
    return adapter


def compiled_step(adapter: ModelAdapter, engine: DictConfig) -> CompiledStep | None:
    """``engine.compile=true``: the adapter's decode step compiled (``csd.fast.CompiledStep``); else None (eager)."""
    if not engine.compile:
        return None
    return CompiledStep(adapter, engine.max_cache_len, engine.compile_backend)


def load_prompts(dataset: DictConfig) -> list[Prompt]:
    """The dataset's prompts; none, an empty or blank one, or fewer than ``dataset.n_prompts`` is a
    :class:`ConfigError`."""
    params = {k: v for k, v in OmegaConf.to_container(dataset, resolve=True).items() if k not in ("name", "_target_", "samples_per_prompt", "num_shards", "shard")}
    prompts = get_method(dataset._target_)(**params)
    _check(bool(prompts), f"dataset={dataset.name} has no prompts")
    blank = next((i for i, p in enumerate(prompts) if not p.text.strip()), None)
    _check(blank is None, f"dataset={dataset.name} prompt {prompts[blank].prompt_id} (index {blank}) is empty: every "
           "prompt needs text (an empty one would make an unconditional image); fix or drop it in the dataset file"
           if blank is not None else "")
    n = dataset.get("n_prompts")
    _check(
        n is None or len(prompts) >= n,
        f"dataset.n_prompts={n}, but dataset={dataset.name} has only {len(prompts)} prompts; "
        f"set dataset.n_prompts={len(prompts)} or null (all)",
    )
    return prompts


def check_captions(model: DictConfig, dataset: str, prompts: Sequence[Prompt]) -> None:
    """Refuse prompts the model cannot read (:meth:`ModelAdapter.caption_problem`: the toy's word vocabulary) before
    it loads, naming the first, how many there are, what the model reads and the dataset to use instead."""
    cls = adapter_class(model)
    problems = [(p, problem) for p in prompts if (problem := cls.caption_problem(p.text)) is not None]
    if problems:
        first, problem = problems[0]
        raise ConfigError(f"dataset={dataset} prompt {first.prompt_id} {problem} ({len(problems)} of {len(prompts)} "
                          f"prompts cannot be read): model={model.name} reads {cls.reads}")


def move_deprecated_keys(cfg: DictConfig) -> list[str]:
    """Move deprecated names to their current place; returns one warning per kind moved.

    ``method.<drafting key>`` (:data:`MOVED_TO_DRAFTER`) goes into ``cfg.drafter``: ``method.tree_width > 1`` on a
    chain drafter switches to ``drafter=pac_tree`` and ``method.tree_width=1`` on a tree to ``drafter=chain``,
    keeping the window settings, as the method keys decoded before the drafter group. A rule's renamed key
    (``method.k`` of LANTERN and Amplify, LANTERN's ``method.delta``) sets its current name.
    """
    warnings = []
    moved = _move_drafter_keys(cfg)
    if moved:
        warnings.append(f"{', '.join(f'method.{k}' for k in moved)} deprecated: the drafting keys moved to the drafter "
                        f"group; use {', '.join(f'drafter.{MOVED_TO_DRAFTER[k]}' for k in moved)}"
                        + (" with drafter=pac_tree" if any(MOVED_TO_DRAFTER[k] in TREE_KEYS for k in moved) else ""))
    method = cfg.method
    renamed = {old: new for old, new in get_class(method._target_).renamed.items() if method.get(old) is not None}
    if renamed:
        with open_dict(method):
            for old, new in renamed.items():
                method[new], method[old] = method[old], None
        warnings.append(f"method={method.name}: {', '.join(f'method.{old}' for old in renamed)} renamed; use "
                        f"{', '.join(f'method.{new}' for new in renamed.values())}")
    return warnings


def _move_drafter_keys(cfg: DictConfig) -> list[str]:
    """The drafting part of :func:`move_deprecated_keys`; returns the keys moved."""
    method = cfg.method
    moved = {key: method[key] for key in MOVED_TO_DRAFTER if method.get(key) is not None}
    if not moved:
        return []
    with open_dict(cfg):
        drafter = cfg.drafter
        width = moved.get("tree_width")
        name = drafter.name if width is None else ("pac_tree" if width > 1 else "chain")
        if name != drafter.name:
            common = {key: drafter[key] for key in ("window", "init", "coupling", "draft_record")}
            drafter = OmegaConf.load(CONF_DIR / "drafter" / f"{name}.yaml")
            if name == "pac_tree":  # the tree keys' values before the drafter group
                common.update(depth=1, code_parity=False)
            drafter.merge_with(common)
        for key, value in moved.items():
            if MOVED_TO_DRAFTER[key] in TREE_KEYS and name != "pac_tree":
                if key != "tree_width":
                    raise ConfigError(f"method.{key} is a tree setting: use drafter=pac_tree "
                                      f"drafter.{MOVED_TO_DRAFTER[key]}={show(value)}")
            else:
                drafter[MOVED_TO_DRAFTER[key]] = value
            method[key] = None
        cfg.drafter = drafter
    return sorted(moved)


def build_drafter(drafter: DictConfig) -> Drafter:
    """The drafter of ``drafter`` (``conf/drafter/<name>.yaml``: its ``_target_`` class and the keys it declares;
    another drafter's key, e.g. a method preset's ``drafter.window`` under ``drafter=draft_model``, is not read, and
    :func:`validate` warns about it)."""
    cls = get_class(drafter._target_)
    params = {k: v for k, v in OmegaConf.to_container(drafter, resolve=True).items() if k in cls.PARAMS}
    try:
        return cls(**params)
    except ValueError as err:
        raise ConfigError(str(err)) from err


@functools.cache
def rule_class_of(method: str) -> type[AcceptanceRule] | None:
    """The rule class of ``method=<method>`` (its config file's ``_target_``), None without a config file in
    ``conf/`` (a rule of one's own has no renamed parameters)."""
    if not (CONF_DIR / "method" / f"{method}.yaml").exists():
        return None
    from csd.study import method_config

    return get_class(method_config(method, {}).method._target_)


def current_method_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A run's or record's ``method_params`` under the rule's current parameter names (``csd.params.renamed``: a run
    made before LANTERN's ``k``/``delta`` became ``neighbours``/``budget`` still resumes, evaluates and reports)."""
    cls = rule_class_of(method)
    return params if cls is None else current_names(cls, params)


def method_params(cfg: DictConfig) -> dict[str, Any]:
    """What a run records about its method: the drafter's settings plus the rule's own hyper-parameters."""
    move_deprecated_keys(cfg)
    return {**build_drafter(cfg.drafter).params(), **build_rule(cfg.method).params()}
