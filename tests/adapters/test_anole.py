"""Anole adapter on a seeded tiny random Chameleon (fp32, CPU).

References are written from the HF model and Anole's documented format directly (docs/MODELS.md, "Anole-7B"): the
conditional row is BOS, the caption, ``<reserved08706>``, ``<racm3:break>``, the unconditional row BOS,
``<racm3:break>``, each a plain no-cache forward, CFG ``u + s (c - u)`` by hand on the image-token columns.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from baselines.relaxed import Amplify
from csd.acceptance import SJD
from csd.adapters.anole import ANOLE_GRID, AnoleAdapter, load_anole_adapter, tiny_anole_adapter
from csd.adapters.lumina import TINY_BYTE0
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.errors import ConfigError, MissingWeightsError
from csd.slot import Request
from csd.validate import validate
from tests.helpers import chi_square_pvalue, decode_counts, rejecting_anole
from tests.pipeline.test_config import make_cfg

PROMPT = "a red cube"
PROMPTS = ["a", "two red circles left of a blue square", "a cat"]


def hf_logits(adapter: AnoleAdapter, ids: list[int]) -> torch.Tensor:
    """``[T, V_raw]`` logits of the plain HF model over one sequence, no cache, no mask."""
    hidden = adapter.model.model(input_ids=torch.tensor([ids])).last_hidden_state
    return adapter.model.lm_head(hidden)[0]


@torch.no_grad()
def reference_greedy(adapter: AnoleAdapter, caption: str) -> torch.Tensor:
    """Greedy AR from the documented rows: argmax of ``u + s (c - u)`` over the image tokens, one full forward per
    row and token."""
    t = adapter.tokens
    cond = [t.bos, *(TINY_BYTE0 + b for b in caption.encode()), t.end_of_turn, t.image_start]
    uncond = [t.bos, t.image_start]
    cols, scale = adapter.image_token_ids, adapter.sampling.guidance_scale
    body: list[int] = []
    for _ in range(adapter.layout.length):
        c, u = hf_logits(adapter, cond + body)[-1, cols], hf_logits(adapter, uncond + body)[-1, cols]
        body.append(int(cols[(u + scale * (c - u)).argmax()]))
    return torch.tensor(body)


def test_prompt_rows_and_layout_are_anoles_format():
    a = tiny_anole_adapter(grid=(2, 3))
    t = a.tokens
    cond, uncond = a.prompt_rows(PROMPT)
    assert cond.tolist() == [t.bos, *(TINY_BYTE0 + b for b in PROMPT.encode()), t.end_of_turn, t.image_start]
    assert uncond.tolist() == [t.bos, t.image_start]
    assert len(tiny_anole_adapter(guidance_scale=1.0).prompt_rows(PROMPT)) == 1
    # 2 x 3 image tokens in raster order, nothing forced (no header, no end-of-line, no end-of-image position)
    assert a.layout.forced_ids.tolist() == [-1] * 6 and a.layout.grid == (2, 3) and a.layout.jacobi_tail == 0
    assert a.layout.rows.tolist() == [0, 0, 0, 1, 1, 1] and a.layout.cols.tolist() == [0, 1, 2, 0, 1, 2]
    # image ids: a permutation of the image-token range (bpe2img), codes <-> ids consistent
    assert sorted(a.image_token_ids.tolist()) != a.image_token_ids.tolist()
    assert torch.equal(a.bpe_to_code[a.image_token_ids], torch.arange(a.vocab_size))


def test_greedy_engine_equals_reference_loop():
    a = tiny_anole_adapter(grid=(2, 3), head_scale=3.0, top_k=1)
    out = JacobiEngine(a, SJD(), ChainDrafter(window=1)).generate(PROMPT, seed=0)
    assert torch.equal(out.tokens, reference_greedy(a, PROMPT))
    assert out.nfe == a.layout.length


def test_batched_tokens_equal_batch_one():
    """SJD, 5 requests of three prompt lengths through 3 slots: tokens, NFE and stats of batch 1, with rejections
    and uneven advances (measured: 26 rejections, 19 of a carried draft; 8 of 10 batched iterations uneven)."""
    a = rejecting_anole()
    reqs = [Request(PROMPTS[i % 3], seed=7 * i, key=i) for i in range(5)]

    def decode(batch_size: int):
        engine = JacobiEngine(a, SJD(), ChainDrafter(window=4), batch_size=batch_size)
        with decode_counts(engine) as counts:
            out = {r.key: (g.tokens.tolist(), g.nfe, g.stats) for r, g in engine.generate_many(reqs)}
        return out, counts

    single, _ = decode(1)
    batched, counts = decode(3)
    assert batched == single
    assert counts.rejections >= 15 and counts.carried_rejections >= 8 and counts.uneven >= 4, counts


def test_image_decodes_through_the_vqgan():
    a = tiny_anole_adapter(grid=(2, 3))
    ids = a.image_token_ids[torch.tensor([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]])]
    images = a.decode_images(ids)
    px = a.vqgan.config.downsample
    assert images.shape == (2, 2 * px, 3 * px, 3) and images.dtype == torch.uint8
    codes = torch.tensor([[0, 1, 2], [3, 4, 5]])
    with torch.no_grad():
        expected = ((a.vqgan(codes[None]).clamp(-1, 1) + 1) / 2 * 255).to(torch.uint8).permute(0, 2, 3, 1)
    assert torch.equal(images[0], expected[0])


@torch.no_grad()
def exact_law(adapter: AnoleAdapter, caption: str) -> dict[tuple[int, ...], float]:
    """P(body) of every body (codes), from the documented rows: one batched no-cache forward per CFG row."""
    t, cols, scale = adapter.tokens, adapter.image_token_ids, adapter.sampling.guidance_scale
    combos = torch.tensor(list(itertools.product(range(adapter.vocab_size), repeat=adapter.layout.length)))
    bodies = cols[combos]
    cond_prompt = torch.tensor([t.bos, *(TINY_BYTE0 + b for b in caption.encode()), t.end_of_turn, t.image_start])
    rows = []
    for prompt in (cond_prompt, torch.tensor([t.bos, t.image_start])):
        ids = torch.cat([prompt.expand(len(combos), -1), bodies[:, :-1]], 1)
        hidden = adapter.model.model(input_ids=ids).last_hidden_state[:, prompt.numel() - 1 :]
        rows.append(adapter.model.lm_head(hidden)[..., cols])
    q = torch.softmax(rows[1] + scale * (rows[0] - rows[1]), dim=-1)  # row n predicts body n
    probs = q.gather(-1, combos.unsqueeze(-1)).squeeze(-1).prod(-1).double()
    return dict(zip(map(tuple, combos.tolist()), probs.tolist(), strict=True))


@pytest.mark.slow
@pytest.mark.statistical
def test_sjd_is_distribution_identical_to_ar_and_amplify_is_not():
    """2x2 tokens over 3 codes (81 bodies, the most likely 0.18, 21 above 1 %), CFG 3."""
    a = tiny_anole_adapter(grid=(2, 2), codes=3, head_scale=6.0, seed=2)
    probs = exact_law(a, PROMPT)
    assert abs(sum(probs.values()) - 1) < 1e-5 and max(probs.values()) < 0.25

    def counts(rule, samples: int, offset: int) -> tuple[Counter, object]:
        engine = JacobiEngine(a, rule, ChainDrafter(window=4))
        with decode_counts(engine) as exercised:
            seen = Counter(tuple(a.bpe_to_code[engine.generate(PROMPT, seed=offset + s).tokens].tolist())
                           for s in range(samples))
        return seen, exercised

    sjd, exercised = counts(SJD(), 600, 0)
    assert chi_square_pvalue(sjd, probs) > 1e-3
    # measured: p = 0.016, 1062 rejections, 491 of a carried draft, 1662 forwards for 600 images of 4 tokens
    assert exercised.rejections >= 500 and exercised.carried_rejections >= 200, exercised
    assert chi_square_pvalue(counts(Amplify(factor=50), 150, 10_000)[0], probs) < 1e-6  # measured: p = 1e-26


# -------------------------------------------------------------------------------------------- loader and config


def test_loader_reads_anole_token_ids_and_builds_the_prompt(tmp_path):
    """A checkpoint in transformers' layout with a word-level tokenizer: the prompt of a known caption is BOS, the
    caption's words, ``<reserved08706>``, ``<racm3:break>`` by the tokenizer's ids, and the weights load unchanged."""
    import yaml
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    ref = tiny_anole_adapter(grid=(2, 2))
    model_dir = tmp_path / "anole"
    ref.model.config.save_pretrained(model_dir)
    save_file({k: v.contiguous() for k, v in ref.model.state_dict().items()}, str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})
    t = ref.tokens
    words = {"a": 100, "red": 101, "cube": 102}
    vocab = {"<s>": t.bos, "<pad>": t.pad, "<unk>": 2, "<racm3:break>": t.image_start, "<eoss>": t.image_end,
             "<reserved08799>": t.eol, "<reserved08706>": t.end_of_turn, "<reserved08800>": t.grid_base, **words}
    word_level = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=word_level, bos_token="<s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(model_dir)
    cfg = ref.vqgan.config
    dd = {"z_channels": cfg.z_channels, "resolution": cfg.resolution, "out_ch": 3, "ch": cfg.ch,
          "ch_mult": list(cfg.ch_mult), "num_res_blocks": cfg.num_res_blocks, "attn_resolutions": list(cfg.attn_resolutions)}
    vq_yaml, vq_ckpt = tmp_path / "vqgan.yaml", tmp_path / "vqgan.ckpt"
    vq_yaml.write_text(yaml.safe_dump({"model": {"params": {"embed_dim": cfg.embed_dim, "n_embed": cfg.n_embed, "ddconfig": dd}}}))
    torch.save({"state_dict": ref.vqgan.state_dict()}, vq_ckpt)

    loaded = load_anole_adapter(str(model_dir), str(vq_yaml), str(vq_ckpt), dtype="float32", top_k=0)
    assert loaded.tokens == t and loaded.layout.grid == ANOLE_GRID and loaded.layout.length == 1024
    assert loaded.prompt_rows(PROMPT)[0].tolist() == [t.bos, 100, 101, 102, t.end_of_turn, t.image_start]
    ids = [t.bos, 100, 101, 102, t.end_of_turn, t.image_start, *ref.image_token_ids[:3].tolist()]
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(loaded, ids), hf_logits(ref, ids), rtol=1e-5, atol=1e-5)

    with pytest.raises(MissingWeightsError, match=r"Anole files not found at .*hf download leloy/Anole-7b-v0.1-hf"):
        load_anole_adapter(str(tmp_path / "absent"), str(vq_yaml), str(vq_ckpt))
    with pytest.raises(MissingWeightsError, match=r"vqgan.yaml not found .*hf download GAIR/Anole-7b-v0.1"):
        load_anole_adapter(str(model_dir), str(tmp_path / "none.yaml"), str(vq_ckpt))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=anole_tiny", "model.grid=3"], "model.grid=3 must be a list of 2 integers >= 1"),
        (["model=anole_tiny", "model.codes=0"], "model.codes=0 must be an integer >= 1"),
        (["model=anole_7b", "model.top_k=0"], r"model.top_k=0 must be an integer >= 1 \(or null for no top-k\)"),
        (["model=anole_7b", "model.guidance_scale=-1"], "model.guidance_scale=-1 must be > 0"),
        (["model=anole_7b", "engine.compile=true"], "engine.compile=true: model=anole_7b has no compiled path"),
    ],
)
def test_bad_values_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(make_cfg(*overrides))
    assert "\n" not in str(err.value)


def test_paper_preset_composes_and_validates(tmp_path):
    """``experiment=paper_anole_7b``: Anole-7B on COCO under LANTERN's protocol, with its caption rule; the extra runs
    its file names (SJD and LANTERN on LANTERN's Anole drafter, its folder checked at config time) validate, and a
    LlamaGen drafter's folder is refused there in one line."""
    from hydra import compose, initialize_config_dir

    from csd.presets import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=paper_anole_7b"], return_hydra_config=True)
    assert cfg.model.name == "anole_7b" and cfg.eval.protocol == "lantern" and cfg.dataset.caption_rule == "lantern"
    assert cfg.hydra.sweeper.params.method == "ar,sjd,lantern,csd,sjd_pac" and cfg.logger.group == "paper_anole_7b"
    for method in cfg.hydra.sweeper.params.method.split(","):
        validate(make_cfg("experiment=paper_anole_7b", f"method={method}"))
    (tmp_path / "config.json").write_text('{"model_type": "chameleon"}')
    (tmp_path / "pytorch_model.bin").write_text("")
    for method in ("sjd", "lantern"):
        validate(make_cfg("experiment=paper_anole_7b", f"method={method}", "drafter=eagle", f"drafter.head={tmp_path}"))
    (tmp_path / "config.json").write_text('{"input_type": "t2i"}')
    with pytest.raises(ConfigError, match=r"is a LANTERN LlamaGen drafter; it drafts for model=llamagen_\*, not "
                                          r"AnoleAdapter$"):
        validate(make_cfg("experiment=paper_anole_7b", "method=lantern", "drafter=eagle", f"drafter.head={tmp_path}"))
