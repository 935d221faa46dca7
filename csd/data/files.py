"""Clear errors for data files that have to be downloaded by the user."""

from __future__ import annotations

from pathlib import Path

DOWNLOAD_HINT = "bash experiments/download_data.sh"


class MissingDataError(FileNotFoundError):
    """A benchmark file is missing; the message names the command that fetches it."""


def require_file(path: str | Path, what: str) -> Path:
    """Return ``path`` if it exists, else raise :class:`MissingDataError` naming the download step."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MissingDataError(f"{what} not found at '{p}'. Fetch it with `{DOWNLOAD_HINT}` (needs internet) "
                               "or point the config at your copy.")
    return p
