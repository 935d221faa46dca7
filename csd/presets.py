"""The config directory ``conf/``: its groups, their options (the presets) and a preset loaded or composed as a run
composes it. Reads YAML files only (Hydra and OmegaConf) and imports nothing of ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


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


def config_groups() -> list[str]:
    """The config groups a command line chooses from (``conf/<group>/``; ``hydra/...`` is Hydra's own)."""
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def nullable_groups() -> list[str]:
    """The config groups ``conf/config.yaml`` chooses nothing from by default (``experiment: null``): the only ones
    ``<group>=null`` may name (Hydra fails on any other with a traceback)."""
    return [group for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults if isinstance(entry, DictConfig)
            for group, option in entry.items() if option is None]


def model_preset(name: str) -> DictConfig:
    """The model preset ``name`` (``<config dir>/model/<name>.yaml``)."""
    return OmegaConf.load(next(d / "model" / f"{name}.yaml" for d in config_dirs() if (d / "model" / f"{name}.yaml").exists()))


def method_config(name: str, values: dict[str, Any]) -> DictConfig:
    """``method=<name>`` as a run composes it: ``{method, drafter}`` (a method preset may choose its drafter), with
    ``values`` set on the method; composed by the running Hydra app, else from ``conf/``."""
    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config", overrides=[f"method={name}"])
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"method={name}"])
    setup = OmegaConf.create({"method": cfg.method, "drafter": cfg.drafter})
    with open_dict(setup):
        for key, value in values.items():
            setup.method[key] = value
    return setup
