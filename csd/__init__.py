"""csd-bench: speculative Jacobi decoding of AR text-to-image models with pluggable acceptance rules.

``Decoder`` and ``compose_config`` (the notebook API, ``csd.api``) are imported on first use: importing ``csd`` (and
any of its modules) costs no model library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Decoder", "compose_config"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from csd import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
