"""Allowed values of config keys (the table is ``csd.keys.SCHEMA``): each spec turns a bad value into one line.

Values arrive as Hydra parses command-line overrides: ``method.lam=abc`` is the string ``'abc'``,
``dataset.n_prompts=2.5`` a float, ``method.lam=[0.1,0.2]`` a ListConfig, ``method.lam=inf`` a float inf.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


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

#: a choice among more options than this is pointed to (its folder), not listed
LISTED_CHOICES = 12


def choice_hint(value: str | None, options: Sequence[str], group: str) -> str:
    """What follows ``<key>=<value>`` when ``value`` is not an option of the config group ``group``: the close match
    alone (``: did you mean toy?``); the members of a family the value names (`` names a family: choose one of
    llamagen_c2i_b, ...``); else the options, listed when they are few, otherwise pointed to (``conf/<group>/``).
    ``value`` None: the options only."""
    if value is not None:
        close = close_names(value, options)
        if close:
            return f": did you mean {close}?"
        family = [o for o in options if o.startswith(value)]
        if family:
            return f" names a family: choose one of {', '.join(family)}"
    if len(options) <= LISTED_CHOICES:
        listed = f"choose one of {', '.join(options)}"
    else:
        listed = f"choose one of the {len(options)} options in conf/{group}/ ({', '.join(options[:3])}, ...)"
    return listed if value is None else f": {listed}"



def show(value: Any) -> str:
    """A value as it is typed on the command line (strings quoted)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class Spec(ABC):
    """The allowed values of one config key; ``null`` says what null means there (None: not allowed)."""

    null: str | None = None

    @abstractmethod
    def describe(self) -> str:
        """What is allowed, as it reads after "must be"."""

    @abstractmethod
    def accepts(self, value: Any) -> bool:
        """Whether a non-null ``value`` is allowed."""

    def error(self, key: str, value: Any) -> str | None:
        """The one-line message for a bad ``value`` of ``key``; None if it is allowed."""
        if value is None:
            return None if self.null is not None else f"{key}=null is not allowed: it must be {self.describe()}"
        if self.accepts(value):
            return None
        message = f"{key}={show(value)} must be {self.describe()}"
        if self.null is not None:
            message += f" (or null{' ' + self.null if self.null else ''})"
        if isinstance(value, ListConfig):
            message += f"; to sweep several values use -m {key}=a,b"
        return message


@dataclass(frozen=True, kw_only=True)
class Int(Spec):
    min: int
    max: int | None = None

    def describe(self) -> str:
        return f"an integer >= {self.min}" if self.max is None else f"an integer in [{self.min}, {self.max}]"

    def accepts(self, value: Any) -> bool:
        return is_int(value) and value >= self.min and (self.max is None or value <= self.max)


@dataclass(frozen=True, kw_only=True)
class IntOrWord(Int):
    """An integer >= ``min`` or the word ``word`` (``engine.batch_size=auto``)."""

    word: str

    def describe(self) -> str:
        return f"{self.word!r} or {super().describe()}"

    def accepts(self, value: Any) -> bool:
        return value == self.word or super().accepts(value)


@dataclass(frozen=True, kw_only=True)
class Float(Spec):
    """A finite number (an int is fine) in ``[min, max]``, or ``> gt``."""

    min: float | None = None
    max: float | None = None
    gt: float | None = None

    def range(self) -> str:
        if self.gt is not None:
            return f"> {self.gt}"
        return f">= {self.min}" if self.max is None else f"in [{self.min}, {self.max}]"

    def describe(self) -> str:
        return f"a finite number {self.range()}"

    def in_range(self, value: float) -> bool:
        if self.gt is not None:
            return value > self.gt
        return value >= self.min and (self.max is None or value <= self.max)

    def accepts(self, value: Any) -> bool:
        return is_number(value) and math.isfinite(value) and self.in_range(value)

    def error(self, key: str, value: Any) -> str | None:
        if is_number(value) and math.isfinite(value) and not self.in_range(value):
            return f"{key}={show(value)} must be {self.range()}"  # the type is right: name only the range
        return super().error(key, value)


@dataclass(frozen=True, kw_only=True)
class Bool(Spec):
    def describe(self) -> str:
        return "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class Str(Spec):
    """A string; ``blank=False``: with more than white space (a directory: ``''`` would be the current one)."""

    blank: bool = True

    def describe(self) -> str:
        return "a string"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def error(self, key: str, value: Any) -> str | None:
        if not self.blank and isinstance(value, str) and not value.strip():
            return f"{key}={show(value)} is empty: give a path" + (f", or null {self.null}" if self.null else
                                                                    ", or null" if self.null is not None else "")
        return super().error(key, value)


@dataclass(frozen=True, kw_only=True)
class Choice(Spec):
    options: tuple[Any, ...]

    def describe(self) -> str:
        return f"one of {list(self.options)}"

    def accepts(self, value: Any) -> bool:
        return any(type(value) is type(o) and value == o for o in self.options)


@dataclass(frozen=True, kw_only=True)
class Group(Spec):
    """A config group's ``name``: one of its ``options()``; the message names the group (``method=...``), or the
    key where a group name is the value of another key (``study.rules.<label>.method=...``)."""

    group: str
    options: Callable[[str], list[str]]

    def describe(self) -> str:
        return f"one of {self.options(self.group)}"

    def accepts(self, value: Any) -> bool:
        return value in self.options(self.group)

    def error(self, key: str, value: Any) -> str | None:
        if self.accepts(value):
            return None
        name = self.group if key == f"{self.group}.name" else key
        return f"{name}={show(value)}{choice_hint(str(value), self.options(self.group), self.group)}"


@dataclass(frozen=True, kw_only=True)
class Device(Spec):
    def describe(self) -> str:
        return "auto, cpu, cuda or cuda:N"

    def accepts(self, value: Any) -> bool:
        return value in ("auto", "cpu", "cuda") or (isinstance(value, str) and value.startswith("cuda:") and value[5:].isdigit())


@dataclass(frozen=True, kw_only=True)
class IntList(Spec):
    length: int
    min: int

    def describe(self) -> str:
        return f"a list of {self.length} integers >= {self.min}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, ListConfig) and len(value) == self.length and all(is_int(v) and v >= self.min for v in value)


@dataclass(frozen=True, kw_only=True)
class StrList(Spec):
    """A list of strings; with ``names``, each must be one of ``names()`` (a ``what``); with ``check``, each
    must pass it (``check(v)`` says what is wrong with ``v``, None if nothing); ``nonempty`` refuses ``[]`` and
    ``unique`` a repeated name."""

    names: Callable[[], list[str]] | None = None
    what: str = "name"
    check: Callable[[str], str | None] | None = None
    nonempty: bool = False
    unique: bool = False

    def describe(self) -> str:
        return "a list of strings"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, ListConfig) and all(isinstance(v, str) for v in value)

    def error(self, key: str, value: Any) -> str | None:
        message = super().error(key, value)
        if message or value is None:
            return message
        if self.nonempty and not value:
            return f"{key}=[] is empty: give at least one {self.what}" + (f", from {self.names()}" if self.names else "")
        repeated = [v for i, v in enumerate(value) if v in list(value)[:i]]
        if self.unique and repeated:
            return f"{key}={show(value)}: {self.what} {repeated[0]!r} is listed twice; list each once"
        problem = next((p for v in value if (p := self.check(v))), None) if self.check is not None else None
        if problem or self.names is None:
            return f"{key}={show(value)}: {problem}" if problem else None
        unknown = [v for v in value if v not in self.names()]
        return f"{key}={show(value)}: unknown {self.what} {unknown[0]!r}; choose from {self.names()}" if unknown else None


@dataclass(frozen=True, kw_only=True)
class StrMap(Spec):
    def describe(self) -> str:
        return "a mapping of strings to strings"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, DictConfig) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


@dataclass(frozen=True, kw_only=True)
class Fields(Spec):
    """A mapping with exactly the keys of ``fields``, each value checked by its own spec (``key.field=...``)."""

    fields: dict[str, Spec]

    def describe(self) -> str:
        return f"a mapping with the keys {list(self.fields)}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, DictConfig) and set(value) == set(self.fields)

    def error(self, key: str, value: Any) -> str | None:
        message = super().error(key, value)
        if message or value is None:
            return message
        return next((m for name, spec in self.fields.items() if (m := spec.error(f"{key}.{name}", value[name]))), None)


@dataclass(frozen=True, kw_only=True)
class FloatList(Spec):
    """A non-empty list of finite numbers, each ``> gt``."""

    gt: float

    def describe(self) -> str:
        return f"a non-empty list of finite numbers > {self.gt}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, ListConfig) and len(value) > 0 and all(
            is_number(v) and math.isfinite(v) and v > self.gt for v in value)


@dataclass(frozen=True, kw_only=True)
class Scalars(Spec):
    """A mapping of names to numbers, booleans or strings (e.g. extra method keys; each value is checked where it
    is used, against that key's own spec)."""

    def describe(self) -> str:
        return "a mapping of names to numbers, booleans or strings"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, DictConfig) and all(
            isinstance(k, str) and isinstance(v, (int, float, bool, str)) for k, v in value.items())


@dataclass(frozen=True, kw_only=True)
class MapOf(Spec):
    """A mapping of names (labels of the user's choice, each a ``what``) to values of the spec ``value``
    (``key.name=...``)."""

    value: Spec
    what: str = "name"

    def describe(self) -> str:
        return f"a mapping of {self.what}s to {self.value.describe()}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, DictConfig)

    def error(self, key: str, value: Any) -> str | None:
        message = super().error(key, value)
        if message or value is None:
            return message
        return next((m for name in value if (m := self.value.error(f"{key}.{name}", value[name]))), None)


@dataclass(frozen=True)
class ByTarget:
    """Different specs for the same key by the group's ``_target_`` (lantern's ``k`` counts neighbours,
    amplify's ``k`` is a factor)."""

    default: Spec
    by: dict[str, Spec] = field(default_factory=dict)

    def pick(self, target: str | None) -> Spec:
        return self.by.get(target, self.default)
