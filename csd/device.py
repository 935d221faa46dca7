"""Host <-> device helpers of the decoding path (no stream synchronisation)."""

from __future__ import annotations

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
