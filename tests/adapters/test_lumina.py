"""Lumina-mGPT adapter on a seeded tiny random Chameleon (fp32, CPU).

References are written here from the HF model directly: full recomputation without a cache, the
conditional and unconditional branches as separate unpadded passes, CFG ``u + s (c - u)`` by hand.
The engine runs count (``tests.helpers.decode_counts``) and require rejections and rollbacks across the forced
tokens (``tests.helpers.rejecting_lumina``: targets of 1.2 nats over 8 codes that move with the previous token).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from baselines.relaxed import Amplify
from csd.acceptance import CSD, SJD
from csd.adapters.lumina import (
    QK_NORM_SUFFIXES,
    LuminaAdapter,
    load_lumina_adapter,
    tiny_lumina_adapter,
)
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.errors import MissingWeightsError
from csd.records import body_problem
from tests.helpers import (
    DecodeCounts,
    OneImage,
    decode_counts,
    forced_token_run,
    random_body,
    rejecting_lumina,
)

PROMPT = "a red cube"




def hf_logits(adapter: LuminaAdapter, ids: torch.Tensor) -> torch.Tensor:
    """``[N, T] -> [N, T, vocab]`` full-vocabulary logits of the plain HF model, no cache, no mask."""
    return adapter.model.lm_head(adapter.model.model(input_ids=ids).last_hidden_state)


def reference_targets(adapter: LuminaAdapter, bodies: torch.Tensor) -> torch.Tensor:
    """Exact targets ``q [N, L-1, V]`` for body positions n >= 1 (row n-1 predicts body n): cond =
    prompt + body, uncond = body alone (from <racm3:break>), CFG on image-code logits, softmax."""
    prompt = adapter.prompt_rows(PROMPT)[0]
    n = bodies.shape[0]
    cols = adapter.image_token_ids
    with torch.no_grad():
        cond = hf_logits(adapter, torch.cat([prompt.expand(n, -1), bodies[:, :-1]], 1))[:, prompt.numel() - 1 :, cols]
        uncond = hf_logits(adapter, bodies[:, :-1])[..., cols]
    scale = adapter.sampling.guidance_scale
    return torch.softmax(uncond + scale * (cond[:, 1:] - uncond), dim=-1)


def reference_greedy(adapter: LuminaAdapter) -> torch.Tensor:
    forced = adapter.layout.forced_ids
    body: list[int] = []
    for n in range(adapter.layout.length):
        if forced[n] >= 0:
            body.append(int(forced[n]))
            continue
        probe = torch.tensor([body + [0]])
        q = reference_targets(adapter, probe)[0, -1]
        body.append(int(adapter.image_token_ids[q.argmax()]))
    return torch.tensor(body)



def test_layout_matches_lumina_format():
    a = tiny_lumina_adapter(grid=(2, 3))
    t = a.tokens
    expected = [t.image_start, t.grid_base + 1, t.grid_base + 1] + ([-1] * 3 + [t.eol]) * 2 + [t.image_end]
    assert a.layout.forced_ids.tolist() == expected
    assert a.layout.grid == (2, 3) and a.layout.rows.max() == 1 and a.layout.cols.max() == 2
    # image ids are a permutation of the image-token range (bpe2img lookup), codes <-> ids consistent
    assert sorted(a.image_token_ids.tolist()) != a.image_token_ids.tolist()
    assert torch.equal(a.bpe_to_code[a.image_token_ids], torch.arange(a.vocab_size))
    prompt = a.prompt_rows(PROMPT)
    assert prompt[0][0] == t.bos and prompt[0][-1] == t.end_of_turn and prompt[1].numel() == 0


def test_greedy_engine_equals_reference_loop():
    a = tiny_lumina_adapter(grid=(2, 3), head_scale=3.0, top_k=1, jacobi_tail=0)
    out = JacobiEngine(a, SJD(), ChainDrafter(window=1)).generate(PROMPT, seed=0)
    assert torch.equal(out.tokens, reference_greedy(a))
    assert out.nfe == a.layout.length


def test_window_logits_equal_step_by_step():
    a = tiny_lumina_adapter(grid=(2, 3))
    body = random_body(a, 0)
    with torch.no_grad():
        ctx = OneImage(a, PROMPT)
        window = ctx.forward(body[:6], with_prompt_tail=True)
        ctx2 = OneImage(a, PROMPT)
        steps = [ctx2.forward(body[:1], with_prompt_tail=True)]
        steps += [ctx2.forward(body[j : j + 1]) for j in range(1, 6)]
    torch.testing.assert_close(window, torch.cat(steps, dim=1), rtol=1e-5, atol=1e-5)


def test_batched_cfg_equals_separate_passes():
    a = tiny_lumina_adapter(grid=(2, 3))
    body = random_body(a, 1)
    prompt = a.prompt_rows(PROMPT)[0]
    with torch.no_grad():
        rows = OneImage(a, PROMPT).forward(body[:7], with_prompt_tail=True)
        cond = hf_logits(a, torch.cat([prompt, body[:7]]).unsqueeze(0))[0, prompt.numel() - 1 :]
        uncond = hf_logits(a, body[:7].unsqueeze(0))[0]
    torch.testing.assert_close(rows[0], cond, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows[1, 1:], uncond, rtol=1e-5, atol=1e-5)
    # the padded anchor of the empty unconditional prompt predicts nothing: it takes the conditional logits
    assert torch.equal(rows[1, 0], rows[0, 0])


def test_rollback_is_exact():
    a = tiny_lumina_adapter(grid=(2, 3))
    body_a, body_b = random_body(a, 2), random_body(a, 3)
    with torch.no_grad():
        ctx = OneImage(a, PROMPT)
        ctx.forward(body_a[:7], with_prompt_tail=True)
        ctx.rollback(4)
        resumed = ctx.forward(body_b[3:7])
        fresh = OneImage(a, PROMPT).forward(torch.cat([body_a[:3], body_b[3:7]]), with_prompt_tail=True)
    torch.testing.assert_close(resumed, fresh[:, -4:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", [SJD(), CSD(lam=1.0, delta=1.0), Amplify(factor=10)], ids=["sjd", "csd", "amplify"])
def test_forced_tokens_land_in_place_and_image_decodes(rule):
    a = rejecting_lumina(grid=(3, 4), jacobi_tail=3)
    out, exercised = forced_token_run(a, rule, PROMPT)
    # rolled back across forced tokens; measured rejections: SJD 17 (13 of a carried draft), Amplify 9, CSD(1, 1) accepts every draft
    assert exercised.rollbacks >= {"sjd": 6, "amplify": 3}.get(rule.name, 0), exercised
    image = a.decode_images(out.tokens.unsqueeze(0))
    ids = a.describe()["token_ids"]  # what records are checked against (csd.records.body_problem)
    assert ids["image"] == [int(a.image_token_ids.min()), int(a.image_token_ids.max())]
    assert set(out.tokens[a.layout.forced_ids >= 0].tolist()) == set(ids["forced"]) and len(ids["forced"]) >= 1
    assert body_problem({"tokens": out.tokens.tolist(), "grid": [3, 4]}, a.describe()) is None
    px = a.vqgan.config.downsample
    assert image.shape == (1, 3 * px, 4 * px, 3) and image.dtype == torch.uint8


# ------------------------------------------------------------------------- distribution identity


def exact_sequence_distribution(a: LuminaAdapter) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Every body of the tiny grid and its exact AR probability (one batched reference forward)."""
    forced = a.layout.forced_ids
    free = (forced < 0).nonzero().flatten()
    combos = list(itertools.product(range(a.vocab_size), repeat=free.numel()))
    bodies = forced.repeat(len(combos), 1)
    bodies[:, free] = a.image_token_ids[torch.tensor(combos)]
    q = reference_targets(a, bodies)  # row n-1 predicts body n
    picked = q[:, free - 1].gather(-1, torch.tensor(combos).unsqueeze(-1)).squeeze(-1)
    return combos, picked.prod(-1).double().numpy()


def empirical_counts(a: LuminaAdapter, rule, combos, samples: int) -> tuple[np.ndarray, DecodeCounts]:
    """How often each body was decoded, and what the run exercised."""
    index = {c: i for i, c in enumerate(combos)}
    free = a.layout.forced_ids < 0
    engine = JacobiEngine(a, rule, ChainDrafter(window=4))
    counts = np.zeros(len(combos))
    with decode_counts(engine) as exercised:
        for seed in range(samples):
            codes = a.bpe_to_code[engine.generate(PROMPT, seed=seed).tokens[free]]
            counts[index[tuple(codes.tolist())]] += 1
    return counts, exercised


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5  # pool the sparse cells so the chi-square approximation holds
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.statistical
def test_sjd_is_distribution_identical_to_ar_and_amplify_is_not():
    a = tiny_lumina_adapter(grid=(2, 2), codes=3, head_scale=6.0, jacobi_tail=0)
    combos, probs = exact_sequence_distribution(a)
    assert abs(probs.sum() - 1) < 1e-6
    counts, exercised = empirical_counts(a, SJD(), combos, 800)
    assert chi_square_p(counts, probs) > 1e-3
    assert exercised.carried_rejections >= 50, exercised  # measured: 888 rejections, 163 of a carried draft
    assert chi_square_p(empirical_counts(a, Amplify(factor=50), combos, 200)[0], probs) < 1e-6


# -------------------------------------------------------------------------------------------- loader


def test_loader_converts_qk_norms_and_reads_token_ids(tmp_path):
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    ref = tiny_lumina_adapter(grid=(2, 2))
    with torch.no_grad():  # Lumina keeps one row per shard: make the heads share it so the conversion is exact
        for layer in ref.model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(norm.weight[:1].expand_as(norm.weight))
                norm.bias.copy_(norm.bias[:1].expand_as(norm.bias))
    model_dir = tmp_path / "lumina"
    ref.model.config.save_pretrained(model_dir)
    state = {k: v.contiguous() for k, v in ref.model.state_dict().items()}
    for name in [k for k in state if k.endswith(QK_NORM_SUFFIXES)]:
        state[name] = state[name][:1].clone()  # the stored [1, head_dim] layout
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    t = ref.tokens
    vocab = {"<s>": t.bos, "<pad>": t.pad, "<unk>": 2, "<racm3:break>": t.image_start, "<eoss>": t.image_end,
             "<reserved08799>": t.eol, "<reserved08706>": t.end_of_turn, "<reserved08800>": t.grid_base}
    word_level = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=word_level, bos_token="<s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(model_dir)
    vq_yaml, vq_ckpt = tmp_path / "vqgan.yaml", tmp_path / "vqgan.ckpt"
    cfg = ref.vqgan.config
    dd = {"z_channels": cfg.z_channels, "resolution": cfg.resolution, "out_ch": 3, "ch": cfg.ch,
          "ch_mult": list(cfg.ch_mult), "num_res_blocks": cfg.num_res_blocks, "attn_resolutions": list(cfg.attn_resolutions)}
    import yaml

    vq_yaml.write_text(yaml.safe_dump({"model": {"params": {"embed_dim": cfg.embed_dim, "n_embed": cfg.n_embed, "ddconfig": dd}}}))
    torch.save({"state_dict": ref.vqgan.state_dict()}, vq_ckpt)

    loaded = load_lumina_adapter(str(model_dir), str(vq_yaml), str(vq_ckpt), resolution=4, dtype="float32", top_k=0)
    assert loaded.tokens == t and loaded.layout.grid == (2, 2)
    assert torch.equal(loaded.layout.forced_ids, ref.layout.forced_ids)
    body = random_body(ref, 4)
    ids = torch.cat([ref.prompt_rows(PROMPT)[0], body]).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(loaded, ids), hf_logits(ref, ids), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loaded.decode_images(body.unsqueeze(0)), ref.decode_images(body.unsqueeze(0)))

    with pytest.raises(MissingWeightsError, match="Lumina-mGPT"):
        load_lumina_adapter(str(tmp_path / "absent"), str(vq_yaml), str(vq_ckpt))
    with pytest.raises(MissingWeightsError, match="vqgan"):
        load_lumina_adapter(str(model_dir), str(tmp_path / "none.yaml"), str(vq_ckpt))
