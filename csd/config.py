"""Config validation and builders: every bad value is reported, with the allowed ones, before any model loads."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, get_method
from omegaconf import DictConfig, OmegaConf

from csd.acceptance import ENTROPY_NORMS, AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.engine import COUPLINGS, INIT_SCHEMES
from csd.prompts import Prompt

log = logging.getLogger(__name__)
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
STAGES = ("generate", "evaluate", "report", "all")
#: method keys that are not hyper-parameters of the acceptance rule
ENGINE_KEYS = ("name", "_target_", "window", "init", "coupling")


class ConfigError(ValueError):
    """A config value is invalid; the message names it and the allowed values."""


def choices(group: str) -> list[str]:
    """The options of a config group (files in ``conf/<group>/``, private ``_*.yaml`` excluded)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _rule_params(method: DictConfig) -> tuple[type[AcceptanceRule], dict[str, Any]]:
    """The rule class and the (non-null) hyper-parameters it accepts; warns about ignored sweep keys."""
    cls = get_class(method._target_)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    params, ignored = {}, {}
    for key, value in method.items():
        if key in ENGINE_KEYS or value is None:
            continue
        (params if key in accepted else ignored)[key] = value
    if ignored:
        log.warning("method=%s has no parameter(s) %s; ignoring them", method.name, sorted(ignored))
    return cls, params


def validate(cfg: DictConfig) -> None:
    """Reject bad values with a message naming the value and what is allowed."""
    _check(cfg.stage in STAGES, f"stage={cfg.stage!r} is not one of {list(STAGES)}")
    m = cfg.method
    _check(m.name in choices("method"), f"method={m.name!r}: choose one of {choices('method')}")
    _check(isinstance(m.window, int) and m.window >= 1, f"method.window={m.window!r} must be an integer >= 1")
    _check(m.name != "ar" or m.window == 1, f"method=ar needs method.window=1, got {m.window}")
    _check(m.init in INIT_SCHEMES, f"method.init={m.init!r}: choose one of {list(INIT_SCHEMES)}")
    _check(m.coupling in COUPLINGS, f"method.coupling={m.coupling!r}: choose one of {list(COUPLINGS)}")
    if m.get("lam") is not None:
        _check(m.lam >= 0, f"method.lam={m.lam} must be >= 0")
    if m.get("delta") is not None:
        _check(0 <= m.delta <= 1, f"method.delta={m.delta} must be in [0, 1]")
    if m.get("entropy_norm") is not None:
        _check(m.entropy_norm in ENTROPY_NORMS, f"method.entropy_norm={m.entropy_norm!r}: choose one of {list(ENTROPY_NORMS)}")
    if m.get("c") is not None:
        _check(m.c >= 0, f"method.c={m.c} must be >= 0")
    if m.get("k") is not None:
        _check(m.k >= 1, f"method.k={m.k} must be >= 1")
    for key in ("group_size", "prob_threshold", "embed_threshold"):
        if m.get(key) is not None:
            _check(m[key] >= 0, f"method.{key}={m[key]} must be >= 0")
    build_rule(m)  # the rule's own checks, still before any model loads

    model = cfg.model
    _check(model.name in choices("model"), f"model={model.name!r}: choose one of {choices('model')}")
    _check(model.guidance_scale > 0, f"model.guidance_scale={model.guidance_scale} must be > 0")
    _check(model.temperature > 0, f"model.temperature={model.temperature} must be > 0")
    if model.get("top_k") is not None:
        _check(isinstance(model.top_k, int) and model.top_k >= 1, f"model.top_k={model.top_k!r} must be an integer >= 1 (or null for no top-k)")

    mcl = cfg.engine.max_cache_len
    _check(mcl is None or (isinstance(mcl, int) and mcl >= 1), f"engine.max_cache_len={mcl!r} must be null or a positive integer")

    data = cfg.dataset
    _check(data.name in choices("dataset"), f"dataset={data.name!r}: choose one of {choices('dataset')}")
    if data.get("n_prompts") is not None:
        _check(data.n_prompts >= 1, f"dataset.n_prompts={data.n_prompts} must be >= 1")
    _check(data.samples_per_prompt >= 1, f"dataset.samples_per_prompt={data.samples_per_prompt} must be >= 1")
    _check(
        cfg.device in ("auto", "cpu", "cuda") or str(cfg.device).startswith("cuda:"),
        f"device={cfg.device!r}: choose auto, cpu, cuda or cuda:N",
    )


def build_rule(method: DictConfig) -> AcceptanceRule:
    cls, params = _rule_params(method)
    try:
        return cls(**params)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(device)


def build_adapter(model: DictConfig, device: torch.device, engine: DictConfig | None = None) -> ModelAdapter:
    """The model's loader with its config values (``engine.compile``: static cache + compiled decode step)."""
    params = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items() if k not in ("name", "_target_")}
    params["top_k"] = params.get("top_k") or 0
    loader = get_method(model._target_)
    if engine is not None and engine.compile:
        if "compile" not in inspect.signature(loader).parameters:
            raise ConfigError(f"engine.compile=true: model={model.name} has no compiled path; use engine.compile=false")
        params.update(cache="static", compile=True, max_cache_len=engine.max_cache_len)
    return loader(**params, device=str(device))


def load_prompts(dataset: DictConfig) -> list[Prompt]:
    params = {k: v for k, v in OmegaConf.to_container(dataset, resolve=True).items() if k not in ("name", "_target_", "samples_per_prompt")}
    return get_method(dataset._target_)(**params)


def method_params(method: DictConfig) -> dict[str, Any]:
    """What a run records about its method: engine settings plus the rule's own hyper-parameters."""
    return {"window": method.window, "init": method.init, "coupling": method.coupling, **build_rule(method).params()}
