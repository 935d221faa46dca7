"""Deprecated names, one table each, and where they moved: the drafting keys of the method group moved to the drafter
group (:data:`MOVED_TO_DRAFTER`), a rule's renamed parameters (its class's ``renamed``, ``csd.params``).

A config's old names are moved before it is checked (:func:`move_deprecated_keys`); a record's or run's recorded
parameters are read under their current names (:func:`current_method_params`), so runs made before a rename still
resume, evaluate and report.
"""

from __future__ import annotations

import functools
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from csd.errors import ConfigError
from csd.params import Parametrized, current_names
from csd.presets import CONF_DIR, method_config
from csd.schema import show

#: the drafting keys that moved from the method to the drafter group (deprecated under ``method.``): old -> new name
MOVED_TO_DRAFTER = {"window": "window", "init": "init", "coupling": "coupling", "draft_record": "draft_record",
                    "tree_width": "width", "tree_depth": "depth", "pac_code_parity": "code_parity"}
#: the tree drafter's own keys (``drafter=pac_tree``)
TREE_KEYS = ("width", "depth", "code_parity")


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


@functools.cache
def rule_class_of(method: str) -> type[Parametrized] | None:
    """The rule class of ``method=<method>`` (its config file's ``_target_``), None without a config file in
    ``conf/`` (a rule of one's own has no renamed parameters)."""
    if not (CONF_DIR / "method" / f"{method}.yaml").exists():
        return None
    return get_class(method_config(method, {}).method._target_)


def current_method_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A run's or record's ``method_params`` under the rule's current parameter names (``csd.params.renamed``: a run
    made before LANTERN's ``k``/``delta`` became ``neighbours``/``budget`` still resumes, evaluates and reports)."""
    cls = rule_class_of(method)
    return params if cls is None else current_names(cls, params)
