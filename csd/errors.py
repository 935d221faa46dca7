"""The errors a run reports in one line (``run.py`` exits 2 with the message): the ground floor, importing nothing.

Every module that refuses bad input raises one of these, so the entry points catch them without importing the
modules that raise them (a model library, the records reader)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value is invalid; the message names it and the allowed values."""


class DatasetFileError(ConfigError):
    """A benchmark file is malformed; the message starts with ``<file>:<line>`` or ``<file>: <entry>``."""


class MissingDataError(FileNotFoundError):
    """A benchmark file is missing; the message names the command that fetches it."""


class MissingWeightsError(FileNotFoundError):
    """Raised (with an actionable message) when a model's files are not available offline."""


class RecordsError(ValueError):
    """``records.jsonl`` cannot be used as it is; the message names the file, the line and what is wrong."""


class LockHeldError(RuntimeError):
    """Another live process (or a process on another host) holds the lock; the message names it."""


class DependencyError(RuntimeError):
    """An installed package is outside the versions the harness runs with; the message names it, the version needed
    and the command that installs it."""


#: what ``run.py`` refuses in one line (exit 2) before Hydra creates a directory or a model loads
INPUT_ERRORS = (ConfigError, RecordsError, LockHeldError, MissingWeightsError, FileNotFoundError, DependencyError)
