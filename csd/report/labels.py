"""The default hyper-parameters of a method (``conf/method/<name>.yaml``): report labels carry only what differs
from them, and each table notes them."""

from __future__ import annotations

import functools
from typing import Any

from csd.config import CONF_DIR


@functools.cache
def method_defaults(method: str) -> dict[str, Any] | None:
    """The ``method_params`` a run of ``method`` records with its config file's values (engine settings and
    the rule's own hyper-parameters), or None for a method without a ``conf/method/`` file."""
    if not (CONF_DIR / "method" / f"{method}.yaml").exists():
        return None
    from csd.config import method_params
    from csd.study import method_config

    return method_params(method_config(method, {}))
