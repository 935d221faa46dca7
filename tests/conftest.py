"""Tests run offline, and on one thread: tiny models are overhead-bound and CI's CPUs are shared."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

torch.set_num_threads(1)
