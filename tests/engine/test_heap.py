"""The CPU engine keeps its per-forward temporaries on the heap (``csd.device.keep_temporaries_on_heap``).

Measured in page faults, not time: a fresh process runs rounds of "allocate and write eight 4 MiB tensors, free them"
(a forward's activations on the toy at B = 16 are blocks of this size). Whether glibc's default (thresholds raised only
as blocks are freed) keeps those pages differs from process to process (5 of 6 fresh processes here faulted every
round's 8 x 1024 pages in anew); the test starts each process from glibc's starting threshold (128 KiB), fixed, where
every block is mapped anew, and checks that building a CPU engine makes the rounds reuse their pages.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

SETUP = """
import ctypes, resource, torch
ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: glibc's starting value, fixed
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        blocks = [torch.empty(1 << 20).fill_(1.0) for _ in range(8)]
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
from tests.helpers import rejecting_janus
adapter = rejecting_janus()
"""
ENGINE = "from csd.acceptance import SJD\nfrom csd.engine import JacobiEngine\nJacobiEngine(adapter, SJD())\n"

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc malloc setting")


def _faults(extra: str) -> int:
    code = SETUP + extra + "faults()\nprint(faults())\n"
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


@pytest.mark.slow
def test_a_cpu_engine_serves_temporaries_from_the_heap():
    assert _faults("") > 4 * 8 * 1024  # the control: every round faults its pages in anew
    assert _faults(ENGINE) < 1024  # with the engine's setting the rounds reuse the first round's pages
