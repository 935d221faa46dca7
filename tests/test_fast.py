"""The fast path (``csd.fast``): StaticCache rollback, token identity with the eager DynamicCache path,
no recompilation across prompts, and the latency benchmark's CPU smoke run.

The compiled adapter uses the ``aot_eager`` backend: the same full-graph, fixed-shape trace as
inductor (graph breaks and recompilations show up identically) without minutes of C++ code generation
on a CPU. Inductor itself reproduced these tokens too (checked by hand; too slow for CI).

The tiny Janus is ``tests.helpers.rejecting_janus`` (4x4 tokens, 16 codes, targets that move with the previous
tokens): the token-identity tests roll the static cache back after rejected carried drafts, which they count.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache, StaticCache

from csd.acceptance import CSD, SJD
from csd.drafters import ChainDrafter
from csd.engine import JacobiEngine, Request
from csd.fast import StaticDecoder, check_transformers_version, rollback_static_cache
from experiments import bench_latency
from tests.helpers import decode_counts, host_reads_per_batched_run, rejecting_janus

torch.set_num_threads(1)

PROMPTS = ("a red cat", "a dog on grass", "a big cat")  # the first and last have equal lengths


@pytest.fixture(scope="module")
def adapters():
    torch.compiler.reset()
    return {
        "dynamic": rejecting_janus(),
        "static": rejecting_janus(cache="static"),
        "compiled": rejecting_janus(cache="static", compile=True, compile_backend="aot_eager"),
    }


def decode(adapter, rule, window: int, pad: bool, prompt: str, seed: int):
    return JacobiEngine(adapter, rule, ChainDrafter(window=window), pad_window=pad).generate(prompt, seed=seed)


@pytest.mark.parametrize(("rule", "window"), [(SJD(), 1), (SJD(), 4), (CSD(lam=0.5, delta=0.9), 4)])
def test_static_and_compiled_paths_are_token_identical(adapters, rule, window):
    rejections = 0
    for seed, prompt in enumerate(PROMPTS[:2]):
        ref = decode(adapters["dynamic"], rule, window, False, prompt, seed)
        rejections += ref.stats["drafts_verified"] - ref.stats["drafts_accepted"]
        for path in ("static", "compiled"):
            gen = decode(adapters[path], rule, window, True, prompt, seed)
            assert torch.equal(gen.tokens, ref.tokens), (path, prompt)
            assert gen.nfe == ref.nfe
            assert torch.equal(gen.commit_iter, ref.commit_iter)
    assert rejections >= 3 or window == 1  # measured: SJD 11, CSD 7 rejections (each rolls the window back)


def test_no_recompilation_across_prompts(adapters):
    compiled = adapters["compiled"]
    for window in (1, 4):  # both step shapes, q = 1 and q = 4, traced on the first prompt
        decode(compiled, SJD(), window, True, PROMPTS[0], 0)
    with torch.compiler.set_stance("fail_on_recompile"):
        for prompt in PROMPTS:
            for window in (1, 4):
                decode(compiled, SJD(), window, True, prompt, 1)
        with pytest.raises(RuntimeError, match="recompile"):  # the check is live: a third shape would compile
            decode(compiled, SJD(), 3, True, PROMPTS[0], 0)
    assert len(compiled.static.caches) == 1


def test_static_decoder_bookkeeping_after_generation(adapters):
    adapter = adapters["static"]
    decode(adapter, SJD(), 4, True, PROMPTS[1], 0)
    prompt_entries = adapter.prompt_rows(PROMPTS[1]).shape[1] - 1
    # the cache holds the prompt, the prompt's last token (first anchor) and every committed token but the last
    assert adapter.static.length == prompt_entries + adapter.layout.length
    assert int(adapter.static.cache.get_seq_length()) == adapter.static.length


@torch.no_grad()
def test_rollback_is_exact_and_matches_dynamic_cache():
    adapter = rejecting_janus()
    model = adapter.model
    prompt = model.get_input_embeddings()(adapter.prompt_rows(PROMPTS[0]))
    window = model.prepare_embeddings_for_image_generation(torch.randint(16, (2, 5)))
    other = model.prepare_embeddings_for_image_generation(torch.randint(16, (2, 5)))
    static = StaticDecoder(adapter.decode_step, model.config.text_config, adapter.layout.length)
    static.prefill(prompt)
    assert static.length == prompt.shape[1]
    first = static.step(window)
    static.rollback(5)
    static.step(other)  # overwrite the rolled-back entries with different states
    static.rollback(5)
    again = static.step(window)
    assert torch.equal(first, again)
    assert static.length == prompt.shape[1] + 5 == int(static.cache.get_seq_length())

    dynamic = DynamicCache(config=model.config.text_config)
    adapter.decode_step(prompt, dynamic)
    torch.testing.assert_close(adapter.decode_step(window, dynamic), first, rtol=1e-5, atol=1e-4)

    static.rollback(2)
    tail = static.step(window[:, 3:])
    torch.testing.assert_close(tail, first[:, 3:], rtol=1e-5, atol=1e-4)


def test_rollback_errors():
    adapter = rejecting_janus()
    config = adapter.model.config.text_config
    static = StaticDecoder(adapter.decode_step, config, body_len=4, max_cache_len=16)
    with pytest.raises(RuntimeError, match="before prefill"):
        static.step(torch.zeros(2, 1, 32))
    static.prefill(torch.zeros(2, 10, 32))
    with pytest.raises(ValueError, match="cannot roll back"):
        static.rollback(11)
    with pytest.raises(ValueError, match="cache overflow"):
        static.step(torch.zeros(2, 7, 32))
    with pytest.raises(ValueError, match="n >= 0"):
        rollback_static_cache(static.cache, -1)
    with pytest.raises(ValueError, match="does not fit"):
        static.prefill(torch.zeros(2, 13, 32))
    with pytest.raises(TypeError, match="StaticLayer"):
        rollback_static_cache(DynamicCache(config=config), 1)
    assert isinstance(static.cache, StaticCache)


def test_transformers_version_guard():
    check_transformers_version()  # the installed (pinned) version is a tested one
    for version in ("5.16.0", "5.25.0", "6.0.0"):
        with pytest.raises(RuntimeError, match="cumulative_length"):
            check_transformers_version(version)


def test_bench_latency_smoke(tmp_path):
    argv = ["--model", "janus_pro_tiny", "--device", "cpu", "--window", "4", "--warmup", "1", "--steps", "2"]
    argv += ["--verify-reps", "10", "--no-compile", "--no-eager-images", "--out", str(tmp_path)]
    res = bench_latency.main(argv)
    saved = json.loads((tmp_path / "janus_pro_tiny_cpu.json").read_text())
    assert saved["meta"]["window"] == 4 and set(saved["paths"]) == {"dynamic", "static"}
    assert saved["paths"]["static"]["ar"]["nfe"] == 64
    assert saved["verify"]["csd_overhead_ms"] == pytest.approx(
        res["verify"]["csd_ms"] - res["verify"]["sjd_ms"]
    )
    assert (tmp_path / "janus_pro_tiny_cpu.md").read_text().startswith("## Latency")


def test_toy_model_static_and_compiled_paths_are_token_identical():
    """The shipped toy model on the fast path: same tokens as its eager DynamicCache path."""
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    prompt = toy_prompts(1)[0].text
    dynamic = load_toy_adapter()
    fast = {
        "static": load_toy_adapter(cache="static"),
        "compiled": load_toy_adapter(cache="static", compile=True, compile_backend="aot_eager"),
    }
    for rule, window in ((SJD(), 1), (CSD(lam=0.5, delta=0.9), 8)):
        ref = decode(dynamic, rule, window, False, prompt, 0)
        for path, adapter in fast.items():
            assert torch.equal(decode(adapter, rule, window, True, prompt, 0).tokens, ref.tokens), path


# ------------------------------------------------------------------ batched compiled decoding (RaggedCache)

BATCH_PROMPTS = ["a", "two red circles left of a blue square", "a cat", "a lighthouse on a cliff at sunset, oil painting"]


def decode_many(adapter, batch_size: int, reqs: list[Request], pad: bool, rule, window: int = 5,
                exercised: list | None = None) -> dict:
    """key -> (tokens, nfe, stats, commit_iter) of every request; ``exercised`` gets the run's ``DecodeCounts``."""
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=window), pad_window=pad, batch_size=batch_size)
    with decode_counts(engine) as counts:
        out = {req.key: (gen.tokens.tolist(), gen.nfe, gen.stats, gen.commit_iter.tolist())
               for req, gen in engine.generate_many(reqs)}
    if exercised is not None:
        exercised.append(counts)
    return out


def batch_requests(n: int, offset: int = 0) -> list[Request]:
    return [Request(BATCH_PROMPTS[i % len(BATCH_PROMPTS)], seed=offset + 7 * i, key=i) for i in range(n)]


def unique_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_batched_compiled_engine_two_graphs_no_recompile_same_tokens():
    """B = 3 on the compiled step: exactly two graphs ([3 * 2, 5] and [3 * 2, 1]) for every prompt, refill and
    rule, and the tokens / NFE / stats of the batched eager engine and of batch 1."""
    torch.compiler.reset()
    compiled = rejecting_janus(cache="static", compile=True, compile_backend="aot_eager")
    eager = rejecting_janus()
    before = unique_graphs()
    decode_many(compiled, 3, batch_requests(3), True, SJD(), window=1)  # q = 1
    decode_many(compiled, 3, batch_requests(3), True, SJD())  # q = 5
    assert unique_graphs() - before == 2
    assert compiled.fixed_cache.rows == 6 and compiled.fixed_cache.fixed
    reqs = batch_requests(7, offset=100)  # more requests than slots: refills, and a partly empty last batch
    exercised = []
    with torch.compiler.set_stance("fail_on_recompile"):
        for rule in (SJD(), CSD(lam=0.5, delta=0.9)):
            batched = decode_many(compiled, 3, reqs, True, rule, exercised=exercised)
            assert batched == decode_many(eager, 3, reqs, False, rule)
            assert batched == decode_many(eager, 1, reqs, False, rule)
        with pytest.raises(RuntimeError, match="recompile"):  # the check is live: a third shape would compile
            decode_many(compiled, 3, reqs[:3], True, SJD(), window=3)
    assert unique_graphs() - before == 2
    # measured (SJD, CSD): 43, 29 rejections; 23, 7 of a carried draft; 14, 8 iterations with uneven advances
    for counts in exercised:
        assert counts.rejections >= 12 and counts.carried_rejections >= 3 and counts.uneven >= 4, counts


def test_batched_compiled_engine_one_host_sync_per_iteration(monkeypatch):
    """As ``tests/test_batched.py``: one read of the committed counts per iteration, plus one per image."""
    adapter = rejecting_janus(cache="static", compile=True, compile_backend="aot_eager")
    engine = JacobiEngine(adapter, CSD(lam=0.5, delta=0.9), ChainDrafter(window=5), pad_window=True, batch_size=3)
    list(engine.generate_many(batch_requests(3)))  # compile outside the count
    reads, expected = host_reads_per_batched_run(engine, batch_requests(4, offset=50), monkeypatch)
    assert reads == expected


def test_batched_static_cache_has_a_fixed_capacity():
    """The first prompt sizes the batched cache (or engine.max_cache_len does); it never grows, a later prompt
    that does not fit is refused naming engine.max_cache_len, and the next batch reuses the buffers."""
    adapter = rejecting_janus(cache="static")
    state = adapter.start_batch(2)
    adapter.prefill_slot(state, 0, "a cat")
    cache = state.cache
    assert cache.fixed and cache.capacity == 256
    with pytest.raises(ValueError, match="engine.max_cache_len"):
        adapter.prefill_slot(state, 1, "a long caption " * 20)
    assert state.cache is cache and cache.capacity == 256
    again = adapter.start_batch(2)
    adapter.prefill_slot(again, 1, "a dog")
    assert again.cache is cache and cache.filled[:2] == [0, 0]  # reused and emptied
    sized = rejecting_janus(cache="static", max_cache_len=48)
    state = sized.start_batch(2)
    sized.prefill_slot(state, 0, "a cat")
    assert state.cache.capacity == 48
    free = 48 - state.cache.filled[0]
    with pytest.raises(ValueError, match="cache overflow.*engine.max_cache_len"):
        sized.forward_batch(state, torch.zeros(2, free + 1, dtype=torch.long), [True, True], [True, False])


def test_toy_model_batched_compiled_engine_matches_eager():
    """The shipped toy model, B = 3 on the compiled step, 4 prompts: the batched eager engine's tokens."""
    from csd.adapters.toy import load_toy_adapter
    from csd.toy.domain import toy_prompts

    reqs = [Request(p.text, seed=i, key=i) for i, p in enumerate(toy_prompts(4))]
    compiled = load_toy_adapter(cache="static", compile=True, compile_backend="aot_eager")
    rule = CSD(lam=0.5, delta=0.9)
    assert decode_many(compiled, 3, reqs, True, rule, window=8) == decode_many(load_toy_adapter(), 3, reqs, False, rule, window=8)
