"""Host <-> device helpers of the decoding path (no stream synchronisation) and its device timer."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


def to_device(values: Sequence[int | bool], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host flags or counts as a device tensor without a stream sync (``torch.tensor(..., device=cuda)`` blocks
    until the queued kernels, e.g. the forward, have run; an asynchronous copy of the staged list does not)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (timings); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Span:
    """The device time of a stretch of the decoding loop without a host synchronisation: between two CUDA events on a
    GPU (read by :meth:`seconds` once the device is synchronised), between two host clock reads on the CPU (whose
    kernels run as they are issued)."""

    def __init__(self, device: torch.device) -> None:
        self.events = self.stream = None
        if device.type == "cuda":
            self.stream = torch.cuda.current_stream(device)
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record(self.stream)
        else:
            self.start = self.end = time.perf_counter()

    def stop(self) -> Span:
        if self.events is None:
            self.end = time.perf_counter()
        else:
            self.events[1].record(self.stream)
        return self

    def seconds(self) -> float:
        """The span's length; on a GPU only after :func:`synchronize`."""
        return self.end - self.start if self.events is None else self.events[0].elapsed_time(self.events[1]) / 1000
