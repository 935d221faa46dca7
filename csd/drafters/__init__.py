"""Drafters: the second plug-in axis of the engine, next to the acceptance rule (``csd.drafters.base``).

``chain``: the Jacobi window of SJD and its variants (init, coupling, recorded law); ``pac_tree``: SJD-PAC's tree
windows; ``draft_model``: a separate small model's drafts (classic speculative sampling); ``eagle``: a chain of drafts
from a trained EAGLE head, or a static tree of them; ``zipar``: ZipAR's rows decoded in parallel (lossy, no drafts:
SJD's rule only); ``pjd``: PJD's Jacobi chains on several rows at once (lossy, any rule). Any other rule runs with any
drafter.
"""

from csd.drafters.base import (
           COUPLINGS,
           DRAFT_RECORDS,
           INIT_SCHEMES,
           STAT_KEYS,
           BodyIds,
           Drafter,
           Proposal,
           Verified,
)
from csd.drafters.chain import ChainDrafter
from csd.drafters.draft_model import DraftModelDrafter
from csd.drafters.eagle import EagleDrafter
from csd.drafters.pac_tree import PacTreeDrafter
from csd.drafters.pjd import PJDDrafter
from csd.drafters.zipar import ZipARDrafter

#: drafter name -> class (``conf/drafter/<name>.yaml``)
DRAFTERS: dict[str, type[Drafter]] = {"chain": ChainDrafter, "pac_tree": PacTreeDrafter, "draft_model": DraftModelDrafter,
                                      "eagle": EagleDrafter, "zipar": ZipARDrafter, "pjd": PJDDrafter}

__all__ = ["COUPLINGS", "DRAFTERS", "DRAFT_RECORDS", "INIT_SCHEMES", "STAT_KEYS", "BodyIds", "ChainDrafter",
           "DraftModelDrafter", "Drafter", "EagleDrafter", "PJDDrafter", "PacTreeDrafter", "Proposal", "Verified",
           "ZipARDrafter"]
