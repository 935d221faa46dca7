"""``--checkout DIR`` of the paired benchmarks: import ``csd`` from another checkout (an older one) instead of this
repository's, so a before / after pair is two runs of one script. ``PYTHONPATH`` cannot do it: ``python -m`` puts the
repository root first on ``sys.path``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def use_checkout(checkout: Path | None, parser: argparse.ArgumentParser) -> Path:
    """Put ``checkout`` first on ``sys.path`` and import ``csd`` (refused in one line through ``parser`` when it is
    not a checkout or ``csd`` comes from elsewhere); returns the checkout ``csd`` was imported from."""
    if checkout is not None:
        if not (checkout / "csd" / "__init__.py").is_file():
            parser.error(f"--checkout {checkout} is not a checkout of this repository (no csd/__init__.py)")
        sys.path.insert(0, str(checkout.resolve()))
    import csd

    if checkout is not None and not Path(csd.__file__).resolve().is_relative_to(checkout.resolve()):
        parser.error(f"csd was imported from {Path(csd.__file__).parent}, not from --checkout {checkout}")
    return Path(csd.__file__).resolve().parent.parent
