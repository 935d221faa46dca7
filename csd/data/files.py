"""Clear errors for data files that have to be downloaded by the user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from csd.config import ConfigError

DOWNLOAD_HINT = "bash experiments/download_data.sh"


class MissingDataError(FileNotFoundError):
    """A benchmark file is missing; the message names the command that fetches it."""


def require_file(path: str | Path, what: str, key: str) -> Path:
    """Return ``path`` if it is a file; else raise :class:`MissingDataError` naming the download step (missing) or
    :class:`DatasetFileError` (a directory; ``key``: the config key that named it)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingDataError(f"{what} not found at '{p}'. Fetch it with `{DOWNLOAD_HINT}` (needs internet) "
                               "or point the config at your copy.")
    if p.is_dir():
        raise DatasetFileError(f"{key}={path} is a directory; give the path of the {what}")
    return p


class DatasetFileError(ConfigError):
    """A benchmark file is malformed; the message starts with ``<file>:<line>`` or ``<file>: <entry>``."""


def read_json(path: Path) -> Any:
    """The parsed JSON file; a syntax error (e.g. a truncated download) names the file, line and column."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise DatasetFileError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
