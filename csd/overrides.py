"""The command line's overrides checked before Hydra composes anything (:func:`check_overrides`): a key, group or option
that does not exist is named with the closest known names (:func:`close_names`), in one line.

Reads only the config files and the key table (``csd.keys``): a typo is answered without importing torch or a model
library.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from csd.errors import ConfigError
from csd.keys import SCHEMA, known_key, known_keys
from csd.presets import CONF_DIR, config_groups, nullable_groups
from csd.schema import choice_hint, close_names, show

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
                    raise ConfigError(f"{key}=null: a run needs a {key}; {choice_hint(None, options, key)}")
                if value is not None and value not in options:
                    raise ConfigError(f"{key}={show(value)}{choice_hint(str(value), options, key)}")
        elif not known_key(key, keys):
            close = close_names(key, [*keys, *groups])
            what = "a config key or group" if "." not in key else "a config key"
            raise ConfigError(f"{key} is not {what}{f'; did you mean {close}?' if close else ''} "
                              f"(to add a new key on purpose: +{arg})")
