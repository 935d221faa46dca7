"""Files from the Hugging Face hub: the local files first, the network only when the hub's host resolves.

The hub client retries a request that fails to connect five times (sleeping 1, 2, 4, 8, 8 s), for each
file a loader asks for: without ``HF_HUB_OFFLINE=1`` on a machine that cannot reach the hub, a missing
Janus-Pro checkpoint took minutes of retries before its missing-files error. :func:`load_local_first` runs a
loader in the hub client's offline mode first (local directories and the local cache only, no request);
only if that fails, and the host of ``HF_ENDPOINT`` resolves (:func:`hub_reachable`, asked once per
process), does it run the loader again with the network. Libraries that download on their own (open_clip)
are covered too: offline mode is the hub client's switch, not a loader argument.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlparse

from huggingface_hub import constants

log = logging.getLogger(__name__)

T = TypeVar("T")

#: seconds to wait for the hub's host name to resolve (a resolver that does not answer counts as unreachable)
RESOLVE_TIMEOUT_S = 3.0


def download_command(repo: str) -> str:
    """The shell command that puts hub repository ``repo`` into a local folder ``<dir>``."""
    return f"hf download {repo} --local-dir <dir>"


def resolves(host: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> bool:
    """Whether ``host`` resolves to an address within ``timeout_s`` (the lookup runs in a daemon thread)."""
    answer: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, 443)
            answer.append(True)
        except OSError:  # socket.gaierror: unknown host, no resolver
            answer.append(False)

    thread = threading.Thread(target=lookup, name="csd-hub-lookup", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answer and answer[0])


@functools.cache
def hub_reachable() -> bool:
    """False under ``HF_HUB_OFFLINE=1`` or when the host of ``HF_ENDPOINT`` does not resolve; decided once per process."""
    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    if resolves(host):
        return True
    log.info("hub host %s does not resolve: hub files come from local files only", host)
    return False


@contextmanager
def offline_mode() -> Iterator[None]:
    """The hub client's offline mode for the duration: local files and the local cache only, no request."""
    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def load_local_first(load: Callable[[], T], missing: tuple[type[Exception], ...] = (OSError, ValueError)) -> T:
    """``load()`` from local files; again with the network only if that raised ``missing`` and the hub is reachable.

    ``missing``: what the loader raises for files it cannot find (transformers and the hub client raise
    ``OSError`` subclasses, ``ValueError`` for a malformed repository id). When the hub is not reachable the
    local attempt's error propagates, so the caller's missing-files message comes without a single request.
    """
    try:
        with offline_mode():
            return load()
    except missing:
        if not hub_reachable():
            raise
    return load()


def without_progress_bar(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """transformers' tqdm hook: its own bars (the "Loading weights" bar of every model load) are created disabled.

    Only bars transformers makes through ``transformers.utils.logging.tqdm`` pass here: the engine's and the
    evaluation's bars, and the hub client's download bars, are plain tqdm and stay.
    """
    return factory(*args, **{**kwargs, "disable": True})


def without_loading_bars() -> None:
    """Install :func:`without_progress_bar` (process-wide): every model load, ``run.py``'s and the notebook API's
    (:func:`csd.compose.build_adapter`), prints no "Loading weights" bar."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_tqdm_hook(without_progress_bar)


def model_files_present(path: str) -> bool:
    """Whether a loader would find a model at ``path`` (a local directory, or a hub id ``org/name``), asked without
    loading or downloading anything: a directory; a hub id whose snapshot (its ``config.json``) is in the local cache;
    any hub id while the hub is reachable (:func:`hub_reachable`: the loader downloads it)."""
    if os.path.isdir(os.path.expanduser(path)):
        return True
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:  # a local path that is not there
        return False
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(path, "config.json")
    except HFValidationError:  # not a valid hub id either
        return False
    return isinstance(cached, str) or hub_reachable()
