"""A run's config checked before any model loads (:func:`validate`): every bad value is reported in one line, with the
allowed ones, and keys nothing reads are warned about, once per config.

Each value is checked against its spec (``csd.keys.SCHEMA``, or its rule's or drafter's declaration in ``csd.params``),
then the rules across keys: the drafter's own (built by ``csd.compose``), the model's, the dataset's, the memory bounds
(``csd.limits``). Validation runs once where a run starts: ``run.py``, the notebook API, each multirun job.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from csd.compose import adapter_class, build_drafter, build_rule, entropy_temperature, rule_params
from csd.deprecations import move_deprecated_keys
from csd.errors import ConfigError
from csd.keys import SCHEMA, SHARED_METHOD_KEYS, UNSET, known_keys
from csd.limits import config_problem
from csd.overrides import close_names
from csd.presets import CONF_DIR, choices, model_preset
from csd.schema import ByTarget, Spec

log = logging.getLogger(__name__)


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
    _check_method_keys(cfg)
    unknown = _check_schema(cfg)
    moved = move_deprecated_keys(cfg)
    if moved:
        _check_schema(cfg)
    _cross_checks(cfg)
    _warn_once(cfg, [*moved, *_warnings(cfg, unknown)])


def _check_method_keys(cfg: DictConfig) -> None:
    """A key the chosen method's own file sets (``conf/method/<name>.yaml``) that the config lacks was deleted
    (``~method.<key>``): the rule would silently take its own default. Refused in one line. A method file from
    elsewhere (``hydra.searchpath``) is not checked."""
    name = OmegaConf.select(cfg, "method.name")
    path = CONF_DIR / "method" / f"{name}.yaml"
    if name is None or not path.is_file():
        return
    preset = OmegaConf.load(path)
    if "@package _global_" in path.read_text(encoding="utf-8").split("\n", 1)[0]:  # a preset of several groups
        preset = preset.get("method") or {}
    own = [key for key in preset if key != "defaults"]
    for key in own:
        _check(key in cfg.method, f"method.{key} is missing (~method.{key} deletes it); method={name} reads it: give "
                                  f"it a value (method.{key}=<value>)")


def _cross_checks(cfg: DictConfig) -> None:
    """The checks across keys, and the rule's and drafter's own, before any model loads. ``stage=status`` and
    ``stage=report`` read directories only: they build no rule, drafter or model, so only their values are checked
    (against their specs), and no model's module is imported."""
    if cfg.stage in ("status", "report"):
        return
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
    build_rule(m)
    entropy_temperature(cfg.model)
    _check_draft_model(cfg)  # the checks below import the model's module (its adapter class)
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
    ignored = rule_params(cfg.method)[2]
    if ignored:
        warnings.append(f"method={cfg.method.name} has no parameter(s) {ignored}; ignoring them")
    return warnings
