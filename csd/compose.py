"""The composition root: the one module that turns a config's names into objects, the acceptance rule
(``method._target_``), the drafter (``drafter._target_``), the model adapter (``model._target_``, a loader), the
prompts (``dataset._target_``) and the compiled step.

Plug-ins are found by the ``_target_`` of their config file (``conf/<group>/<name>.yaml``), imported when built: no
module below this one names a concrete rule, drafter, model or dataset, and importing it imports none of them.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from hydra.utils import get_class, get_method
from omegaconf import DictConfig, OmegaConf

from csd.acceptance import AcceptanceRule
from csd.adapters.base import WEIGHTS_CHECKS, EntropyTemperature, ModelAdapter, check_transformers
from csd.deprecations import MOVED_TO_DRAFTER, move_deprecated_keys
from csd.drafters.base import Drafter
from csd.errors import ConfigError
from csd.hub import without_loading_bars
from csd.presets import model_preset
from csd.prompts import Prompt

if TYPE_CHECKING:
    from csd.fast import CompiledStep

#: method keys that are not hyper-parameters of the acceptance rule
ENGINE_KEYS = ("name", "_target_", *MOVED_TO_DRAFTER)


def rule_params(method: DictConfig) -> tuple[type[AcceptanceRule], dict[str, Any], list[str]]:
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


def build_rule(method: DictConfig) -> AcceptanceRule:
    """The acceptance rule of ``method`` with the hyper-parameters it accepts (others are ignored)."""
    cls, params, _ = rule_params(method)
    try:
        return cls(**params)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def build_drafter(drafter: DictConfig) -> Drafter:
    """The drafter of ``drafter`` (``conf/drafter/<name>.yaml``: its ``_target_`` class and the keys it declares;
    another drafter's key, e.g. a method preset's ``drafter.window`` under ``drafter=draft_model``, is not read, and
    :func:`validate` warns about it)."""
    cls = get_class(drafter._target_)
    params = {k: v for k, v in OmegaConf.to_container(drafter, resolve=True).items() if k in cls.PARAMS}
    if "model" in cls.PARAMS:  # a drafter with a model of its own loads it when bound, through the composition root
        params["load"] = load_draft_adapter
    try:
        return cls(**params)
    except ValueError as err:
        raise ConfigError(str(err)) from err


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


def method_params(cfg: DictConfig) -> dict[str, Any]:
    """What a run records about its method: the drafter's settings plus the rule's own hyper-parameters."""
    move_deprecated_keys(cfg)
    return {**build_drafter(cfg.drafter).params(), **build_rule(cfg.method).params()}


def entropy_temperature(model: DictConfig) -> EntropyTemperature | None:
    """``model.entropy_temperature`` (None: off) as the processor's parameters; ``lo > hi`` is a :class:`ConfigError`."""
    params = model.get("entropy_temperature")
    if params is None:
        return None
    try:
        return EntropyTemperature(**OmegaConf.to_container(params))
    except ValueError as err:
        raise ConfigError(f"model.entropy_temperature={OmegaConf.to_container(params)}: {err}") from err


def adapter_class(model: DictConfig) -> type[ModelAdapter]:
    """The adapter class ``model._target_`` (a loader function) returns, from its return annotation: what the model
    supports (``compilable``) is known before any weight loads."""
    return typing.get_type_hints(get_method(model._target_))["return"]


def loader_params(model: DictConfig) -> dict[str, Any]:
    """The keyword arguments of the model's loader (``model._target_``): its config values but the name, the
    evaluation's ``reference_render`` and what :func:`build_adapter` applies itself."""
    params = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items()
              if k not in ("name", "_target_", "entropy_temperature", "reference_render")}
    params["top_k"] = params.get("top_k") or 0
    return params


def check_weights(model: DictConfig) -> None:
    """Raise the ``MissingWeightsError`` the model's loader would (its registered check:
    ``csd.adapters.base.WEIGHTS_CHECKS``), without loading anything; a loader without a check (the toy, the tiny
    models) needs no files. First, the installed transformers must be one the adapters run with
    (``csd.adapters.base.check_transformers``)."""
    check_transformers()
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
    from csd.fast import (
        CompiledStep,  # the fixed cache subclasses transformers' Cache: imported when compiling
    )

    return CompiledStep(adapter, engine.max_cache_len, engine.compile_backend)


class Models:
    """The adapter of one model config, built on first use and kept, with its compiled step per compile setting.

    The runs of one process that decode with the same model (the study: its calibration and every run) share one copy
    of the weights and one set of compiled graphs, instead of loading and compiling per run and holding two copies
    at once (the calibration's and a run's). Another model config or device replaces the kept one (freed first). A
    decoded image depends only on its prompt and seed, never on which engine ran on the adapter before.
    """

    def __init__(self) -> None:
        self._key: tuple[str, str] | None = None
        self._adapter: ModelAdapter | None = None
        self._compiled: dict[tuple[Any, ...], CompiledStep] = {}

    def adapter(self, model: DictConfig, device: torch.device) -> ModelAdapter:
        """:func:`build_adapter` of ``model`` on ``device``, or the kept adapter when it is that one."""
        key = (json.dumps(OmegaConf.to_container(model, resolve=True), sort_keys=True), str(device))
        if self._adapter is None or key != self._key:
            self._key, self._adapter, self._compiled = None, None, {}  # the old weights go before the new ones load
            self._adapter, self._key = build_adapter(model, device), key
        return self._adapter

    def compiled(self, adapter: ModelAdapter, engine: DictConfig) -> CompiledStep | None:
        """:func:`compiled_step` of the kept ``adapter`` under ``engine``, built once per compile setting."""
        if adapter is not self._adapter:
            raise ValueError("Models.compiled: the adapter is not the kept one (Models.adapter)")
        key = (engine.compile, engine.max_cache_len, engine.compile_backend)
        if key not in self._compiled:
            step = compiled_step(adapter, engine)
            if step is None:
                return None
            self._compiled[key] = step
        return self._compiled[key]


def load_prompts(dataset: DictConfig) -> list[Prompt]:
    """The dataset's prompts; none, an empty or blank one, or fewer than ``dataset.n_prompts`` is a
    :class:`ConfigError`."""
    params = {k: v for k, v in OmegaConf.to_container(dataset, resolve=True).items() if k not in ("name", "_target_", "samples_per_prompt", "num_shards", "shard")}
    prompts = get_method(dataset._target_)(**params)
    if not prompts:
        raise ConfigError(f"dataset={dataset.name} has no prompts")
    blank = next((i for i, p in enumerate(prompts) if not p.text.strip()), None)
    if blank is not None:
        raise ConfigError(f"dataset={dataset.name} prompt {prompts[blank].prompt_id} (index {blank}) is empty: every "
                          "prompt needs text (an empty one would make an unconditional image); fix or drop it in the "
                          "dataset file")
    n = dataset.get("n_prompts")
    if n is not None and len(prompts) < n:
        raise ConfigError(f"dataset.n_prompts={n}, but dataset={dataset.name} has only {len(prompts)} prompts; "
                          f"set dataset.n_prompts={len(prompts)} or null (all)")
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
