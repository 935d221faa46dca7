"""The compiled decode path with the inductor backend on CPU (``engine.compile_backend=inductor``: real code
generation and C++ kernels, not only the trace that ``aot_eager`` checks in tests/engine/test_fast.py).

On the toy model and the tiny Janus (``tests.helpers.rejecting_janus``), at batch 1 and B = 3: the step compiles
fullgraph (a graph break is an error) into exactly two graphs, ``q = 1`` and ``q = L``, and the verification of full
windows (``csd.drafters.chain.judge_windows``) into one graph per rule (two at B = 3: some windows padded); more prompts than slots
(refills, a partly empty last batch), prompts of other lengths (the tiny Janus's byte prompts) and images whose last
window is partial (padded to L) decode without any recompilation, with the eager path's tokens, NFE, stats and
commit iterations in fp32, for SJD and CSD.

Measured with a cold inductor cache on the shared 2-core machine: 7 min wall, 118 s of CPU time (docs/PERFORMANCE.md),
about 20 s of compilation per shape: the test is marked ``inductor`` and left out of the default run
(pyproject.toml); run it with ``pytest -m inductor``.
"""

from __future__ import annotations

import pytest
import torch

from csd.acceptance import CSD, SJD
from csd.drafters.chain import judge_windows
from csd.fast import CompiledStep, step_and_target
from csd.slot import Request
from experiments.rule_exactness import rule_presets
from tests.engine.test_fast import batch_requests, decode_many, graphs, judge_case
from tests.helpers import rejecting_janus

pytestmark = [pytest.mark.slow, pytest.mark.inductor]


def toy_case():
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    return load_toy_adapter(), [Request(p.text, seed=i, key=i) for i, p in enumerate(toy_prompts(5))], 8


def janus_case():
    return rejecting_janus(), batch_requests(5, offset=100), 5


@pytest.mark.parametrize("case", [janus_case, toy_case], ids=["tiny_janus", "toy"])
def test_inductor_two_graphs_no_recompilation_eager_tokens(case):
    torch.set_num_threads(1)
    torch.compiler.reset()
    adapter, requests, window = case()
    for batch in (1, 3):
        torch.compiler.reset()
        compiled = CompiledStep(adapter, backend="inductor")
        step = step_and_target
        decode_many(adapter, batch, requests[:batch], compiled, SJD(), window=1)  # trace q = 1
        for rule in (SJD(), CSD(lam=0.5, delta=0.9)):  # q = L, and each rule's verification of every window kind
            decode_many(adapter, batch, requests, compiled, rule, window=window)
        assert graphs(step) == 2 and graphs(judge_windows) == (2 if batch == 1 else 4)
        with torch.compiler.set_stance("fail_on_recompile"):
            for rule in (SJD(), CSD(lam=0.5, delta=0.9)):
                compiled_out = decode_many(adapter, batch, requests, compiled, rule, window=window)
                assert compiled_out == decode_many(adapter, batch, requests, None, rule, window=window)
            with pytest.raises(RuntimeError, match="recompile"):  # the check is live: a third shape would compile
                decode_many(adapter, batch, requests[:batch], compiled, SJD(), window=window - 1)
        assert graphs(step) == 2 and graphs(judge_windows) == (2 if batch == 1 else 4)


@pytest.mark.parametrize("method", rule_presets())
def test_every_rule_verifies_with_inductor_code_and_eager_results(method):
    """Every rule class of ``conf/method/`` through :func:`judge_windows` compiled by inductor (C++ code), its
    real-valued parameters tensors as the compiled engine passes them: the eager function's results with the rule's
    Python floats, bit for bit, for two values of every parameter, on one graph (:func:`judge_case`)."""
    torch.set_num_threads(1)
    judge_case(method, "inductor")
