"""Experiment scripts run one way: ``python -m experiments.<name> ...`` from the repository root.

Run by path (``python experiments/<name>.py ...``), the script's own folder, not the repository root, is first on
``sys.path``: ``experiments`` does not import there (a script importing a sibling failed with ``ModuleNotFoundError``)
and ``csd`` comes from wherever it is installed rather than this checkout. So every script starts, right after its
``from __future__`` import and before any other import, with::

    if __spec__ is None:  # run by path: refused in one line naming the command (experiments/_entry.py)
        from _entry import refuse_path_run

        refuse_path_run(__file__)

``__spec__`` is None only for a file run by path; under ``-m`` or an import the block does nothing. The import finds
this file through the script's own folder, so it uses the standard library only. A block of an ``if`` is no import
boundary for ruff's E402, so the script's imports after it need no ``noqa``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import NoReturn


def module_command(script: str, args: list[str]) -> str:
    """The command that runs ``script`` (a path to ``experiments/<name>.py``) with ``args``, shell-quoted."""
    return shlex.join(["python", "-m", f"experiments.{Path(script).stem}", *args])


def refuse_path_run(script: str) -> NoReturn:
    """One line on stderr naming the ``python -m`` command with the user's arguments, then exit status 2."""
    print(f"run it as a module from the repository root: {module_command(script, sys.argv[1:])}", file=sys.stderr)
    raise SystemExit(2)
