"""Drafters: the second plug-in axis of the engine, next to the acceptance rule (``csd.drafters.base``).

``chain``: the Jacobi window of SJD and its variants (init, coupling, recorded law); ``pac_tree``: SJD-PAC's tree
windows; ``draft_model``: a separate small model's drafts (classic speculative sampling); ``eagle``: a chain of drafts
from a trained EAGLE head, or a static tree of them; ``zipar``: ZipAR's rows decoded in parallel (lossy, no drafts:
SJD's rule only); ``pjd``: PJD's Jacobi chains on several rows at once (lossy, any rule); ``ssd``: SSD's trained
spatial heads with r per-position correction rounds (lossy); ``hawk``: tree windows of candidates from spatial
(horizontal and vertical) draft heads. Any other rule runs with any drafter.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the drafters by class name -> their module, imported on first use (``conf/drafter/<name>.yaml``'s ``_target_``
#: names them here: importing this package imports none, and so no model library)
DRAFTERS = {"ChainDrafter": "chain", "PacTreeDrafter": "pac_tree", "DraftModelDrafter": "draft_model",
            "EagleDrafter": "eagle", "ZipARDrafter": "zipar", "PJDDrafter": "pjd",
            "SSDDrafter": "ssd", "HawkDrafter": "hawk"}

__all__ = sorted(DRAFTERS)


def __getattr__(name: str) -> Any:
    if name in DRAFTERS:
        return getattr(importlib.import_module(f"{__name__}.{DRAFTERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
