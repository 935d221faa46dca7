"""The report stage: sweep tables, Pareto plots and content-awareness plots from evaluated runs.

``build_report`` and ``SweepReportCallback`` (``conf/config.yaml``'s Hydra callback) are imported on first use: a run
that only names the callback (every ``run.py`` command) pays for neither pandas nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> its module
EXPORTS = {"build_report": "build", "SweepReportCallback": "callback"}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name in EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
