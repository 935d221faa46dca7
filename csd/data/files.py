"""Clear errors for data files that have to be downloaded by the user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from csd.device import available_memory, gb
from csd.errors import DatasetFileError, MissingDataError

DOWNLOAD_HINT = "bash experiments/download_data.sh"


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


def read_json(path: Path) -> Any:
    """The parsed JSON file; a syntax error (e.g. a truncated download) names the file, line and column."""
    check_size(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise DatasetFileError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None


def check_size(path: Path) -> None:
    """Refuse a prompts file larger than the available RAM before reading it: its text alone is held in memory (whole
    by ``json.load``; as the prompts of a JSON-lines file), so a larger one cannot be read (docs/USAGE.md, "Limits")."""
    size, ram = path.stat().st_size, available_memory(torch.device("cpu"))
    if size > ram:
        raise DatasetFileError(f"{path}: {gb(size)} GB, more than the {gb(ram)} GB of available RAM that reading it "
                               "takes; give a smaller prompts file")
