"""One switch for every progress bar of a stage: ``engine.progress`` (generation, decode and evaluation alike; on by
default, for long work). The composition root sets it for the stage's duration (:func:`shown`); the bars of the
evaluation's metrics ask :func:`bar`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")
_SHOWN = [True]


@contextmanager
def shown(on: bool) -> Iterator[None]:
    """Bars on (``True``) or off while the block runs; the previous setting after it."""
    _SHOWN.append(bool(on))
    try:
        yield
    finally:
        _SHOWN.pop()


def bar(iterable: Iterable[T], **kwargs: Any) -> Iterable[T]:
    """``tqdm(iterable, **kwargs)``, disabled while bars are off (:func:`shown`)."""
    return tqdm(iterable, disable=not _SHOWN[-1], **kwargs)
