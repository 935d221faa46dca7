"""What a report calls a run: its method, its drafter where that tells runs apart, and the hyper-parameters that
differ from the defaults (``conf/method/<name>.yaml`` with the run's ``conf/drafter/<name>.yaml``), all under
their current names (the recorded tree keys ``tree_width`` ... are the tree drafter's ``width`` ...)."""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import OmegaConf

from csd.deprecations import MOVED_TO_DRAFTER, TREE_KEYS
from csd.errors import ConfigError
from csd.presets import CONF_DIR

#: the drafters that record no ``drafter`` entry in ``method_params`` (csd.drafters.base.Drafter.params)
CHAIN, TREE = "chain", "pac_tree"


def drafter_of(params: dict[str, Any]) -> str:
    """The drafter a run's recorded ``method_params`` were decoded with: their ``drafter`` entry, else the tree
    drafter where the tree keys say so (``tree_width`` > 1; ``csd.deprecations.move_deprecated_keys`` reads ``1`` as the
    chain), else the chain."""
    if "drafter" in params:
        return str(params["drafter"])
    return TREE if (params.get("tree_width") or 1) > 1 else CHAIN


def label_params(params: dict[str, Any]) -> dict[str, Any]:
    """Recorded ``method_params`` under the current names of their config keys (:data:`csd.deprecations.MOVED_TO_DRAFTER`),
    without the drafter's name (:func:`drafter_of` gives it) and, on the chain, without the tree keys of
    ``K = 1`` some runs recorded."""
    drafter = drafter_of(params)
    out = {}
    for key, value in params.items():
        name = MOVED_TO_DRAFTER.get(key, key)
        if key == "drafter" or (drafter == CHAIN and key in MOVED_TO_DRAFTER and name in TREE_KEYS):
            continue
        out[name] = value
    return out


@functools.cache
def default_drafter(method: str) -> str | None:
    """The drafter ``method=<method>`` composes with (a preset may choose one: ``sjd_pac`` the tree), or None for a
    method without a ``conf/method/`` file."""
    if not (CONF_DIR / "method" / f"{method}.yaml").exists():
        return None
    from csd.presets import method_config

    return str(method_config(method, {}).drafter.name)


@functools.cache
def method_defaults(method: str, drafter: str | None = None) -> dict[str, Any] | None:
    """The :func:`label_params` a run of ``method`` records with its config file's values (engine settings and the
    rule's own hyper-parameters) on ``drafter`` (``conf/drafter/<drafter>.yaml``; None: the method's own,
    :func:`default_drafter`), or None for a method or drafter without a config file in ``conf/``."""
    if not (CONF_DIR / "method" / f"{method}.yaml").exists():
        return None
    from csd.compose import method_params
    from csd.presets import method_config

    setup = method_config(method, {})
    if drafter is not None and drafter != setup.drafter.name:
        path = CONF_DIR / "drafter" / f"{drafter}.yaml"
        if not path.exists():
            return None
        setup.drafter = OmegaConf.load(path)
    try:
        return label_params(method_params(setup))
    except ConfigError:  # a preset's method keys that this drafter refuses: no defaults to compare with
        return None
