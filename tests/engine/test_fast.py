"""The compiled path (``csd.fast.CompiledStep``): token identity with the eager path on the same ragged cache,
exactly two step graphs and no recompilation across prompts, refills and batches, the verification compiled for every
rule, rollback of the fixed cache, and the latency benchmark's CPU smoke run.

The compiled step uses the ``aot_eager`` backend: the same full-graph, fixed-shape trace as inductor (graph breaks and
recompilations show up identically) without minutes of C++ code generation on a CPU. Inductor itself is tested in
tests/engine/test_inductor.py (minutes; ``pytest -m inductor``).

The tiny Janus is ``tests.helpers.rejecting_janus`` (4x4 tokens, 16 codes, targets that move with the previous
tokens): the token-identity tests roll the fixed cache back after rejected carried drafts, which they count.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from csd import fast
from csd.acceptance import CSD, SJD
from csd.drafters.chain import ChainDrafter, judge_windows
from csd.engine import JacobiEngine
from csd.fast import CompiledStep, step_and_target
from csd.ragged import SlotBatch, reference_logits
from csd.slot import Request
from experiments import bench_latency, rule_exactness
from tests.helpers import OneImage, decode_counts, host_reads_per_batched_run, rejecting_janus

torch.set_num_threads(1)

PROMPTS = ("a red cat", "a dog on grass", "a big cat")  # the first and last have equal lengths


@pytest.fixture(scope="module")
def janus():
    """The tiny Janus and its compiled step (one per adapter: the engine reuses its graphs and fixed cache)."""
    torch.compiler.reset()
    adapter = rejecting_janus()
    return adapter, CompiledStep(adapter, backend="aot_eager")


def decode(adapter, rule, window: int, compiled: CompiledStep | None, prompt: str, seed: int):
    return JacobiEngine(adapter, rule, ChainDrafter(window=window), compiled=compiled).generate(prompt, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize(("rule", "window"), [(SJD(), 1), (SJD(), 4), (CSD(lam=0.5, delta=0.9), 4)])
def test_compiled_path_is_token_identical(janus, rule, window):
    adapter, compiled = janus
    rejections = 0
    for seed, prompt in enumerate(PROMPTS[:2]):
        ref = decode(adapter, rule, window, None, prompt, seed)
        rejections += ref.stats["drafts_verified"] - ref.stats["drafts_accepted"]
        gen = decode(adapter, rule, window, compiled, prompt, seed)
        assert torch.equal(gen.tokens, ref.tokens), prompt
        assert gen.nfe == ref.nfe
        assert torch.equal(gen.commit_iter, ref.commit_iter)
    assert rejections >= 3 or window == 1  # measured: SJD 11, CSD 7 rejections (each rolls the window back)


@pytest.mark.slow
def test_no_recompilation_across_prompts(janus):
    adapter, compiled = janus
    for window in (1, 4):  # both step shapes, q = 1 and q = 4, traced on the first prompt
        decode(adapter, SJD(), window, compiled, PROMPTS[0], 0)
    cache = compiled.cache
    with torch.compiler.set_stance("fail_on_recompile"):
        for prompt in PROMPTS:
            for window in (1, 4):
                decode(adapter, SJD(), window, compiled, prompt, 1)
        with pytest.raises(RuntimeError, match="recompile"):  # the check is live: a third shape would compile
            decode(adapter, SJD(), 3, compiled, PROMPTS[0], 0)
    assert compiled.cache is cache  # one fixed cache for every prompt


@torch.no_grad()
def test_rollback_is_exact_and_matches_the_reference():
    """A rolled-back window overwritten by another gives the first window's logits again, bit for bit; both match the
    no-cache forward."""
    adapter = rejecting_janus()
    window, other = (torch.randint(16, (5,), generator=torch.Generator().manual_seed(s)) for s in (0, 1))
    image = OneImage(adapter, PROMPTS[0])
    first = image.forward(window, with_prompt_tail=True)
    image.rollback(6)
    image.forward(other, with_prompt_tail=True)  # overwrite the rolled-back entries with different states
    image.rollback(6)
    again = image.forward(window, with_prompt_tail=True)
    assert torch.equal(first, again)
    torch.testing.assert_close(first, reference_logits(adapter, PROMPTS[0], window), rtol=1e-5, atol=1e-4)
    image.rollback(3)
    tail = image.forward(window[2:])
    torch.testing.assert_close(tail, first[:, 3:], rtol=1e-5, atol=1e-4)


def test_bench_latency_smoke(tmp_path):
    argv = ["--model", "janus_pro_tiny", "--device", "cpu", "--window", "4", "--warmup", "1", "--steps", "2"]
    argv += ["--verify-reps", "10", "--no-compile", "--no-eager-images", "--out", str(tmp_path)]
    res = bench_latency.main(argv)
    saved = json.loads((tmp_path / "janus_pro_tiny_cpu.json").read_text())
    assert saved["meta"]["window"] == 4 and set(saved["paths"]) == {"eager"}
    assert saved["paths"]["eager"]["ar"]["nfe"] == 64
    assert saved["verify"]["csd_overhead_ms"] == pytest.approx(
        res["verify"]["csd_ms"] - res["verify"]["sjd_ms"]
    )
    assert (tmp_path / "janus_pro_tiny_cpu.md").read_text().startswith("## Latency")


@pytest.mark.slow
def test_toy_model_compiled_path_is_token_identical():
    """The shipped toy model on the compiled path: the eager path's tokens."""
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    prompt = toy_prompts(1)[0].text
    adapter = load_toy_adapter()
    compiled = CompiledStep(adapter, backend="aot_eager")
    for rule, window in ((SJD(), 1), (CSD(lam=0.5, delta=0.9), 8)):
        ref = decode(adapter, rule, window, None, prompt, 0)
        assert torch.equal(decode(adapter, rule, window, compiled, prompt, 0).tokens, ref.tokens)


@pytest.mark.slow
@pytest.mark.parametrize("coupling", ["none", "gumbel"])
def test_one_row_windows_sampled_in_the_step_give_the_eager_tokens(coupling, monkeypatch):
    """AR (window 1) and a chain's AR tail on the compiled path: the step's graph samples every one-row window from the
    noise the drafter drew at the proposal (own draws, or the image's Gumbel-shared noise), and the images get the
    eager path's tokens, NFE and stats at batch 1 and with refills at B = 3; no one-row window is sampled after it."""
    import csd.drafters.chain as chain

    adapter = rejecting_janus()
    compiled = CompiledStep(adapter, backend="aot_eager")
    reqs = [Request(PROMPTS[i % len(PROMPTS)], seed=11 * i, key=i) for i in range(4)]
    sample_race, after = chain.sample_race, []

    def counted(*args):
        after.append(1)
        return sample_race(*args)

    def run(window: int, batch: int, step: CompiledStep | None) -> dict:
        engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=window, coupling=coupling), batch_size=batch,
                              compiled=step)
        return {r.key: (g.tokens.tolist(), g.nfe, g.stats) for r, g in engine.generate_many(reqs)}

    for window, batch in ((1, 1), (1, 3), (4, 3)):
        ref = run(window, batch, None)
        monkeypatch.setattr(chain, "sample_race", counted)  # one-row samples drawn outside the step's graph
        assert run(window, batch, compiled) == ref, (window, batch)
        monkeypatch.setattr(chain, "sample_race", sample_race)
        assert not after


# ------------------------------------------------------------------ batched compiled decoding (RaggedCache)

BATCH_PROMPTS = ["a", "two red circles left of a blue square", "a cat", "a lighthouse on a cliff at sunset, oil painting"]


def decode_many(adapter, batch_size: int, reqs: list[Request], compiled: CompiledStep | None, rule, window: int = 5,
                exercised: list | None = None) -> dict:
    """key -> (tokens, nfe, stats, commit_iter) of every request; ``exercised`` gets the run's ``DecodeCounts``."""
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=window), batch_size=batch_size, compiled=compiled)
    with decode_counts(engine) as counts:
        out = {req.key: (gen.tokens.tolist(), gen.nfe, gen.stats, gen.commit_iter.tolist())
               for req, gen in engine.generate_many(reqs)}
    if exercised is not None:
        exercised.append(counts)
    return out


def batch_requests(n: int, offset: int = 0) -> list[Request]:
    return [Request(BATCH_PROMPTS[i % len(BATCH_PROMPTS)], seed=offset + 7 * i, key=i) for i in range(n)]


def graphs(fn) -> int:
    """The graphs dynamo holds for ``fn``'s code (one per input shape and guard set)."""
    return len(_debug_get_cache_entry_list(fn.__code__))


@pytest.mark.slow
def test_batched_compiled_engine_two_graphs_no_recompile_same_tokens():
    """B = 3 on the compiled step: exactly two step graphs ([3 * 2, 5] and [3 * 2, 1]) for every prompt, refill and
    rule, the verification of full windows compiled once per rule and window kind (every window full; some shorter or
    empty, padded), and the tokens / NFE / stats of the batched eager engine and of batch 1."""
    torch.compiler.reset()
    adapter = rejecting_janus()
    compiled = CompiledStep(adapter, backend="aot_eager")
    reqs = batch_requests(7, offset=100)  # more requests than slots: refills, and a partly empty last batch
    decode_many(adapter, 3, batch_requests(3), compiled, SJD(), window=1)  # q = 1
    for rule in (SJD(), CSD(lam=0.5, delta=0.9)):  # q = 5, and each rule's verification
        decode_many(adapter, 3, reqs, compiled, rule)
    step = step_and_target
    assert graphs(step) == 2 and graphs(judge_windows) == 4
    assert compiled.cache.rows == 6 and compiled.cache.fixed
    exercised = []
    with torch.compiler.set_stance("fail_on_recompile"):
        for rule in (SJD(), CSD(lam=0.5, delta=0.9)):
            batched = decode_many(adapter, 3, reqs, compiled, rule, exercised=exercised)
            assert batched == decode_many(adapter, 3, reqs, None, rule)
            assert batched == decode_many(adapter, 1, reqs, None, rule)
        with pytest.raises(RuntimeError, match="recompile"):  # the check is live: a third shape would compile
            decode_many(adapter, 3, reqs[:3], compiled, SJD(), window=3)
    assert graphs(step) == 2 and graphs(judge_windows) == 4
    # measured (SJD, CSD): 43, 29 rejections; 23, 7 of a carried draft; 14, 8 iterations with uneven advances
    for counts in exercised:
        assert counts.rejections >= 12 and counts.carried_rejections >= 3 and counts.uneven >= 4, counts


@pytest.mark.slow
def test_one_verification_graph_for_every_rule_value():
    """The engines of one compiled step for many values of a rule's parameters (the study's calibration of ``lam``, a
    sweep in one process) share one graph of the full-window verification: the compiled engine passes the rule's
    real-valued parameters as tensors (``with_tensor_params``), inputs of the graph instead of constants of its trace.
    Nine values of ``lam`` and ``delta``, one more than dynamo's recompile limit for one function: one graph, no
    recompilation after the first, and every value decodes the eager path's tokens (rejections included)."""
    torch.compiler.reset()
    adapter = rejecting_janus()
    compiled = CompiledStep(adapter, backend="aot_eager")
    rejections = 0
    for i in range(torch._dynamo.config.recompile_limit + 1):
        rule = CSD(lam=0.05 * (i + 1), delta=0.5 + 0.05 * i)
        ref = decode(adapter, rule, 5, None, PROMPTS[0], i)
        rejections += ref.stats["drafts_verified"] - ref.stats["drafts_accepted"]
        with torch.compiler.set_stance("fail_on_recompile" if i > 0 else "default"):
            gen = decode(adapter, rule, 5, compiled, PROMPTS[0], i)
        assert torch.equal(gen.tokens, ref.tokens) and gen.stats == ref.stats, (rule.lam, rule.delta)
    assert graphs(judge_windows) == 1
    assert rejections >= 9


@pytest.mark.slow
def test_a_sweep_past_the_recompile_limit_keeps_the_verification_compiled():
    """A sweep in one process (Hydra's basic launcher) builds a compiled step per job, and each job's verification
    is compiled for that step. Nine jobs, one more than dynamo's recompile limit for one function: the ninth job's
    verification still compiles (each compiled step's graphs are its own) instead of running eagerly."""
    torch.compiler.reset()
    adapter = rejecting_janus()
    stats = torch._dynamo.utils.counters["stats"]
    for lam in [0.05 * (i + 1) for i in range(torch._dynamo.config.recompile_limit + 1)]:
        engine = JacobiEngine(adapter, CSD(lam=lam, delta=0.9), ChainDrafter(window=5),
                              compiled=CompiledStep(adapter, backend="eager"))
        judge, compiled_in_judge = engine.drafter.compiled_judge, []

        def counted(*args, judge=judge, compiled_in_judge=compiled_in_judge):
            before = stats["unique_graphs"]
            out = judge(*args)
            compiled_in_judge.append(stats["unique_graphs"] - before)
            return out

        engine.drafter.compiled_judge = counted
        engine.generate(PROMPTS[0], seed=0)
        assert sum(compiled_in_judge) >= 1, (lam, compiled_in_judge)  # 0: dynamo ran it eagerly


def norm_epsilons(adapter, eps: float) -> None:
    """Every RMS norm of ``adapter``'s decoder set to ``eps``: a constant of the module tree that a graph bakes in."""
    for module in adapter.decoder().modules():
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = eps


@pytest.mark.slow
@pytest.mark.parametrize("isolates", [True, False], ids=["isolated", "older-torch"])
def test_compiled_step_graphs_belong_to_their_adapter(isolates, monkeypatch):
    """The step's guards skip the model's module tree (csd.fast.compile_step), so each compiled step keeps its graphs
    to itself: two adapters of one class and shapes that differ in a baked-in constant (the norms' epsilon) each
    decode their own eager tokens, in one process, alternately. On a torch without ``isolate_recompiles``
    (``csd.fast.ISOLATES`` false) the module-tree guards stay and tell them apart."""
    assert fast.ISOLATES  # the pinned torch isolates
    monkeypatch.setattr(fast, "ISOLATES", isolates)
    torch.compiler.reset()
    plain, odd = rejecting_janus(), rejecting_janus()
    norm_epsilons(odd, 30.0)
    steps = {id(a): CompiledStep(a, backend="eager") for a in (plain, odd)}
    tokens = {}
    for adapter in (plain, odd, plain, odd):
        ref = decode(adapter, SJD(), 3, None, PROMPTS[0], 0)
        assert torch.equal(decode(adapter, SJD(), 3, steps[id(adapter)], PROMPTS[0], 0).tokens, ref.tokens)
        tokens[id(adapter)] = ref.tokens
    assert not torch.equal(tokens[id(plain)], tokens[id(odd)])  # the constant matters


@pytest.mark.slow
def test_compiled_step_does_not_guard_the_module_tree():
    """A call checks the guards on its arguments, not those on the model's modules (one set per decoder layer, the
    cost of a call that grows with depth): a module attribute changed after compiling replays the graph (the model is
    documented as frozen once compiled), a new argument shape compiles a new one."""
    torch.compiler.reset()
    adapter = rejecting_janus()
    compiled = CompiledStep(adapter, backend="eager")
    decode(adapter, SJD(), 3, compiled, PROMPTS[0], 0)
    norm_epsilons(adapter, 30.0)
    with torch.compiler.set_stance("fail_on_recompile"):
        decode(adapter, SJD(), 3, compiled, PROMPTS[0], 0)
        with pytest.raises(RuntimeError, match="recompile"):
            decode(adapter, SJD(), 4, compiled, PROMPTS[0], 0)


@pytest.mark.slow
def test_batched_compiled_engine_one_host_sync_per_iteration(monkeypatch):
    """As ``tests/engine/test_batched.py``: one read of the committed counts per iteration, plus one per image."""
    adapter = rejecting_janus()
    engine = JacobiEngine(adapter, CSD(lam=0.5, delta=0.9), ChainDrafter(window=5), batch_size=3,
                          compiled=CompiledStep(adapter, backend="aot_eager"))
    list(engine.generate_many(batch_requests(3)))  # compile outside the count
    reads, expected = host_reads_per_batched_run(engine, batch_requests(4, offset=50), monkeypatch)
    assert reads == expected


def test_compiled_cache_has_a_fixed_capacity():
    """The first prompt sizes the compiled path's cache (or engine.max_cache_len does); it never grows, a later prompt
    that does not fit is refused naming engine.max_cache_len, and the next batch reuses the buffers."""
    adapter = rejecting_janus()
    compiled = CompiledStep(adapter, backend="eager")
    batch = SlotBatch(adapter, 2, compiled)
    batch.prefill(0, "a cat")
    cache = batch.cache
    assert cache.fixed and cache.capacity == 256
    with pytest.raises(ValueError, match="engine.max_cache_len"):
        batch.prefill(1, "a long caption " * 20)
    assert batch.cache is cache and cache.capacity == 256
    again = SlotBatch(adapter, 2, compiled)
    again.prefill(1, "a dog")
    assert again.cache is cache and cache.filled[:2] == [0, 0]  # reused and emptied
    sized = SlotBatch(adapter, 2, CompiledStep(adapter, max_cache_len=48, backend="eager"))
    sized.prefill(0, "a cat")
    assert sized.cache.capacity == 48
    free = 48 - sized.cache.filled[0]
    with pytest.raises(ValueError, match="cache overflow.*engine.max_cache_len"):
        sized.forward(torch.zeros(2, free + 1, dtype=torch.long), [True, True], [True, False])


def test_fixed_cache_mask_is_causal_over_the_whole_capacity():
    """The compiled path's mask (``RaggedCache.extend`` on a fixed cache, read from the causal table): for rows of
    different lengths and either window length, 0 where key ``k <= position``, the dtype's minimum after, over the
    whole capacity (the graphs' one key bound)."""
    from transformers import LlamaConfig

    from csd.cache import RaggedCache

    config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)
    cache = RaggedCache(config, 3, 24, torch.float32, torch.device("cpu"), fixed=True)
    cache.extend(slice(0, 3), 2)
    cache.extend(slice(0, 3), 3, advance=[True, False, True])
    for q in (1, 4):
        start = cache.lengths.clone()
        positions, mask = cache.extend(slice(0, 3), q)
        assert torch.equal(positions, start[:, None] + torch.arange(q))
        keys = torch.arange(24)
        want = torch.where(keys <= positions[:, :, None], 0.0, torch.finfo(torch.float32).min)
        assert mask.shape == (3, 1, q, 24) and torch.equal(mask[:, 0], want)


def test_fixed_cache_feed_in_the_graph_equals_extend():
    """``reserve`` + ``feed`` + ``advance`` (the compiled step's split of ``extend``: positions, mask and write indices
    computed in the graph) give ``extend``'s position ids, mask, write indices, device lengths and host mirror, bit for
    bit, for rows of different lengths, a row that does not advance (it writes past its length, clamped) and either
    window length; traced by dynamo (``fullgraph``) too. A cache that is not fixed, or has recorded shifted positions,
    is refused."""
    from transformers import LlamaConfig

    from csd.cache import RaggedCache

    config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)

    def caches() -> list[RaggedCache]:
        out = []
        for _ in range(2):
            cache = RaggedCache(config, 3, 12, torch.float32, torch.device("cpu"), fixed=True)
            cache.extend(slice(0, 3), 2)
            cache.extend(slice(0, 3), 3, advance=[True, False, True])
            cache.extend(slice(0, 3), 6, advance=[True, False, False])  # lengths 11, 2, 5 of 12
            out.append(cache)
        return out

    traced = torch.compile(lambda cache, q: cache.feed(q), backend="eager", fullgraph=True, dynamic=False)
    for feed in (RaggedCache.feed, traced):
        for q, advance in ((1, [True, True, True]), (4, [False, True, True]), (1, [False, True, True])):
            want, got = caches()
            positions, mask = want.extend(slice(0, 3), q, advance)
            got.reserve(q, advance)
            got_positions, got_mask = feed(got, q)
            got.advance(slice(0, 3), q, advance)
            assert torch.equal(got_positions, positions) and torch.equal(got_mask, mask)
            assert torch.equal(got._write, want._write) and torch.equal(got._row_index, want._row_index)
            assert torch.equal(got.lengths, want.lengths) and got.filled == want.filled
            assert (got._bound, got._span, got._active) == (want._bound, want._span, want._active)
    assert int(positions[0, 0]) == 11  # the full row that does not advance writes to its last entry
    with pytest.raises(ValueError, match="cache overflow"):
        caches()[0].reserve(2, [True, False, False])
    with pytest.raises(ValueError, match="fixed cache"):
        RaggedCache(config, 1, 12, torch.float32, torch.device("cpu")).reserve(1, [True])


@torch.no_grad()
def test_compiled_forward_computes_the_target_in_the_step():
    """``SlotBatch.forward(target=...)`` on the compiled step: the target of every column and its entropy come out of
    the step's graph, equal to the pipeline on the returned logits; where a row's first column is replaced (an empty
    prompt's first window), none come out and the caller computes them from the logits."""
    from csd.acceptance import entropy
    from csd.processors import TargetPipeline

    adapter = rejecting_janus()
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    batch = SlotBatch(adapter, 2, CompiledStep(adapter, backend="aot_eager"))
    for slot, prompt in enumerate(PROMPTS[:2]):
        batch.prefill(slot, prompt)
    ids = torch.randint(16, (2, 5), generator=torch.Generator().manual_seed(0))
    logits, folded = batch.forward(ids, [True, True], [True, True], target=pipeline)
    q, q_entropy, samples = folded
    assert q.shape == (2, 5, 16) and torch.equal(q, pipeline(logits)) and torch.equal(q_entropy, entropy(q))
    assert samples is None  # no noise given: nothing sampled
    batch.rollback([5, 5])
    batch.no_prompt[3] = True  # slot 1's second row: as if its prompt were empty
    again, folded = batch.forward(ids, [True, True], [True, True], target=pipeline)
    assert folded is None and torch.equal(again[0], logits[0]) and torch.equal(again[1, 1, 0], logits[1, 0, 0])


def test_compiled_forward_samples_one_row_windows_in_the_step():
    """With ``noise``, the compiled step's graph also samples every column, ``argmax q / E`` (``sample_race``) of the
    target it returns; the eager path refuses noise (it has no graph to sample in)."""
    from csd.processors import TargetPipeline
    from csd.verify import exponential_noise, sample_race

    adapter = rejecting_janus()
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    batch = SlotBatch(adapter, 2, CompiledStep(adapter, backend="aot_eager"))
    for slot, prompt in enumerate(PROMPTS[:2]):
        batch.prefill(slot, prompt)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(16, (2, 1), generator=gen)
        noise = exponential_noise((2, 1, 16), gen, torch.device("cpu"))
        _, (q, _, samples) = batch.forward(ids, [False, False], [True, True], target=pipeline, noise=noise)
        assert samples.shape == (2, 1) and torch.equal(samples, sample_race(q, noise))
    eager = SlotBatch(adapter, 2)
    for slot, prompt in enumerate(PROMPTS[:2]):
        eager.prefill(slot, prompt)
    with pytest.raises(ValueError, match="only the compiled step"):
        eager.forward(ids, [False, False], [True, True], target=pipeline, noise=noise)


def test_adapters_without_a_compiled_path_are_refused():
    from tests.helpers import rejecting_lumina

    with pytest.raises(ValueError, match="LuminaAdapter has no compiled path"):
        CompiledStep(rejecting_lumina(grid=(2, 2)))


@pytest.mark.slow
def test_toy_model_batched_compiled_engine_matches_eager():
    """The shipped toy model, B = 3 on the compiled step, 4 prompts: the batched eager engine's tokens."""
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    reqs = [Request(p.text, seed=i, key=i) for i, p in enumerate(toy_prompts(4))]
    adapter = load_toy_adapter()
    rule = CSD(lam=0.5, delta=0.9)
    compiled = CompiledStep(adapter, backend="aot_eager")
    assert decode_many(adapter, 3, reqs, compiled, rule, window=8) == decode_many(adapter, 3, reqs, None, rule, window=8)


def judge_case(method: str, backend: str) -> None:
    """``experiments.rule_exactness.judge_case`` on the CPU, full graph: every output of ``method``'s compiled
    verification equal to the eager one's for its preset values and for every real-valued parameter moved, one graph
    for both, and a rejected window among them (the residual's sample judged too)."""
    result = rule_exactness.judge_case(method, backend, torch.device("cpu"))
    assert result["equal"], (method, backend, result["unequal"], result["values"])
    assert result["graphs"] == 1 and result["rejected"]


@pytest.mark.parametrize("method", rule_exactness.rule_presets())
def test_every_rule_verifies_fullgraph_with_eager_results(method):
    """Every rule class of ``conf/method/`` (``rule_exactness.rule_presets``) on dynamo's full-graph trace (:func:`judge_case`;
    inductor's code generation: tests/engine/test_inductor.py)."""
    judge_case(method, "eager")


def test_rule_exactness_reports_a_compiled_verification_that_differs(monkeypatch):
    """Negative control of :func:`judge_case`: when the compiled verification gets other parameter values than the eager
    one (CSD's ``lam`` and ``delta`` raised on the way into the graph), its tokens differ and the check says which outputs."""
    from csd.params import Parametrized

    passed = Parametrized.with_tensor_params

    def doubled(self, device):
        out = passed(self, device)
        out.lam, out.delta = out.lam + 10, out.delta + 1  # every draft passes the filter and is accepted
        return out

    monkeypatch.setattr(Parametrized, "with_tensor_params", doubled)
    result = rule_exactness.judge_case("csd", "eager", torch.device("cpu"))
    assert not result["equal"] and "preset: tokens" in result["unequal"] and "moved: tokens" in result["unequal"]
    assert rule_exactness.main(["--backend", "eager", "--device", "cpu", "--methods", "csd"]) == 1  # the command fails
    monkeypatch.setattr(Parametrized, "with_tensor_params", passed)
    assert rule_exactness.main(["--backend", "eager", "--device", "cpu", "--methods", "csd"]) == 0


def test_rule_exactness_refuses_a_verification_dynamo_ran_eagerly():
    """Negative control: past dynamo's recompile limit the "compiled" verification runs eagerly (what a torch without
    ``isolate_recompiles`` does once other graphs of ``judge_windows`` filled the limit, e.g. late in the GPU check),
    so eager equals eager and compares nothing: the check reports it instead of passing."""
    with torch._dynamo.config.patch(recompile_limit=0):
        result = rule_exactness.judge_case("csd", "eager", torch.device("cpu"), fullgraph=False)
    assert not result["equal"] and result["graphs"] == 0 and result["unequal"][-1].startswith("graphs: 0")


def test_more_verification_graphs_than_dynamo_keeps_run_eagerly():
    """One process may verify under ``engine.compile`` with more rules and batch shapes than dynamo keeps graphs of
    one function (its recompile limit, 8): a Hydra sweep on the basic launcher runs every job in one process. The
    verification then runs eagerly, with the same results, instead of stopping the run."""
    from csd.acceptance import entropy
    from csd.verify import WindowNoise

    adapter = rejecting_janus()
    compiled = CompiledStep(adapter, backend="eager").compile(judge_windows)
    torch.compiler.reset()
    gen = torch.Generator().manual_seed(1)
    for batch in range(1, torch._dynamo.config.recompile_limit + 3):
        target = torch.softmax(3 * torch.randn((batch, 4, 16), generator=gen), -1)
        draft_probs = torch.softmax(3 * torch.randn((batch, 3, 16), generator=gen), -1)
        drafts = draft_probs.argmax(-1)
        noise = WindowNoise.draw(batch, 4, 16, gen, torch.device("cpu"))
        args = (SJD(), target, entropy(target), drafts, draft_probs, None, noise, None)
        for got, want in zip(compiled(*args), judge_windows(*args), strict=True):
            assert torch.equal(got, want)
