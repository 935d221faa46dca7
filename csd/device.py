"""Host <-> device helpers of the decoding path (no stream synchronisation), its device timer and the free memory of
a device (the memory planner's and the input bounds' budget)."""

from __future__ import annotations

import ctypes
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from csd.errors import ConfigError

#: glibc ``mallopt`` parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit machines (32 MiB)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
HEAP_THRESHOLD = 32 << 20
_heap_kept = False
#: bytes in a GB (the planner's unit: decimal, as device sizes are quoted)
GB = 1e9


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


def keep_temporaries_on_heap() -> bool:
    """On a CPU with glibc, serve allocations of up to :data:`HEAP_THRESHOLD` bytes from the heap and keep up to four
    times that free on it: True once set (every later call is a no-op), False where there is no glibc.

    glibc's malloc maps every block above its mmap threshold (128 KiB at start, raised only when such a block is freed)
    as fresh pages and unmaps it on free, and returns a freed heap top above twice that threshold to the system, so
    each forward's activations may fault their pages in anew, depending on the process's allocation history: 32 toy
    images at B = 16 (SJD) faulted 2.7 M pages without this setting and 0.18 M with it (sys time 6.1 s -> 0.6 s).
    Process-wide; values are unchanged, only where memory comes from.
    """
    global _heap_kept
    if _heap_kept:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    _heap_kept = bool(libc.mallopt(_M_MMAP_THRESHOLD, HEAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, 4 * HEAP_THRESHOLD))
    return _heap_kept


def available_memory(device: torch.device) -> int:
    """Free bytes of ``device``: CUDA's free memory, or the machine's available RAM (``MemAvailable``) on CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gb(n: float) -> str:
    """Bytes as GB, with three significant digits below 1 GB."""
    return f"{n / GB:.2f}" if n >= GB else f"{n / GB:.3g}"


def resolve_device(device: str) -> torch.device:
    """The torch device of ``device`` (``auto``: CUDA when available); a CUDA device without CUDA is a
    :class:`ConfigError`."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but no CUDA device is available; use device=cpu or device=auto")
    return torch.device(device)
