"""Shared test helpers: offline environment, tiny models, exact distributions and chi-square tests."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from csd.adapters.base import DecodeContext, ModelAdapter  # noqa: E402
from csd.processors import TargetPipeline  # noqa: E402


@torch.no_grad()
def exact_sequence_distribution(adapter: ModelAdapter, prompt: str) -> dict[tuple[int, ...], float]:
    """P(body) = prod_n q_n(x_n | x_<n) for every free-token sequence, by enumeration (forced tokens fixed)."""
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    layout = adapter.layout
    free = (layout.forced_ids < 0).tolist()
    n_free = sum(free)
    ctx = adapter.prefill(prompt)
    out = {}
    for combo in itertools.product(range(adapter.vocab_size), repeat=n_free):
        it = iter(combo)
        idx = [next(it) if f else 0 for f in free]
        ids = torch.where(layout.forced_ids >= 0, layout.forced_ids, adapter.image_token_ids[torch.tensor(idx)])
        raw = adapter.forward(ctx, ids[:-1].to(adapter.device), with_prompt_tail=True)
        adapter.rollback(ctx, layout.length)
        q = pipeline(raw)
        prob = 1.0
        for pos, is_free in enumerate(free):
            if is_free:
                prob *= float(q[pos, idx[pos]])
        out[combo] = prob
    return out


def chi_square_pvalue(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float], min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells with small expected counts are pooled into one."""
    total = sum(counts.values())
    keys = sorted(probs, key=lambda k: -probs[k])
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key in keys:
        e = probs[key] * total
        if e >= min_expected:
            obs.append(counts.get(key, 0))
            exp.append(e)
        else:
            pool_o += counts.get(key, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp_arr = np.array(exp) * (sum(obs) / sum(exp))
    return float(stats.chisquare(np.array(obs), exp_arr).pvalue)


def random_body(adapter: ModelAdapter, seed: int) -> torch.Tensor:
    """A body of random image ids with the forced structural tokens in place."""
    gen = torch.Generator().manual_seed(seed)
    forced = adapter.layout.forced_ids
    free = adapter.image_token_ids[torch.randint(adapter.vocab_size, forced.shape, generator=gen)]
    return torch.where(forced >= 0, forced, free)


def count_host_reads(monkeypatch) -> list[str]:
    """Record every host read of a device value (``item``, ``int``, ``bool``, ``tolist``, ...) until undone."""
    calls: list[str] = []
    for name in ("item", "__int__", "__bool__", "__float__", "__index__", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def host_reads_per_batched_run(engine, requests, monkeypatch) -> tuple[int, int]:
    """(host reads of device values, iterations + finished images) while ``engine`` decodes ``requests``:
    the engine's contract is one read per iteration (the committed counts) plus one per finished image."""
    calls = count_host_reads(monkeypatch)
    iterations = []
    step = engine._iteration

    def counting(state, slots):
        iterations.append(1)
        return step(state, slots)

    monkeypatch.setattr(engine, "_iteration", counting)
    gens = [gen for _, gen in engine.generate_many(requests)]
    monkeypatch.undo()
    return len(calls), len(iterations) + len(gens)


@contextlib.contextmanager
def active_slots_per_forward(adapter: ModelAdapter) -> Iterator[list[int]]:
    """The number of active slots of every ``adapter.forward_batch`` call made inside the block."""
    calls: list[int] = []
    forward = adapter.forward_batch

    def counting(state, ids, from_prompt, active, **kwargs):
        calls.append(sum(active))
        return forward(state, ids, from_prompt, active, **kwargs)

    adapter.forward_batch = counting
    try:
        yield calls
    finally:
        del adapter.forward_batch


def prefilled_batch(adapter: ModelAdapter, prompts: list[str] | tuple[str, ...]) -> tuple[Any, list[DecodeContext]]:
    """A batch state with ``prompts[i]`` prefilled into slot ``i``, and each prompt's single-context prefill."""
    state = adapter.start_batch(len(prompts))
    contexts = []
    for slot, prompt in enumerate(prompts):
        adapter.prefill_slot(state, slot, prompt)
        contexts.append(adapter.prefill(prompt))
    return state, contexts
