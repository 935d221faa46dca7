"""LlamaGen on seeded tiny random configs (fp32, CPU): our GPT on the ragged cache against its no-cache forward and a
plain greedy loop, batch independence, SJD's losslessness on a 2x2-token model (with a relaxed rule as negative
control), the VQ16 decoder, and loading both checkpoint layouts strictly.

The comparison with the original's own forward (FoundationVision/LlamaGen ``gpt.py`` + ``generate.py``, rebuilt outside
the repository once) is reported in docs/MODELS.md, "LlamaGen".
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

from baselines.relaxed import Amplify
from csd.acceptance import SJD
from csd.adapters.llamagen import (
    LlamaGenAdapter,
    class_id,
    decoder_only,
    load_gpt,
    tiny_llamagen_adapter,
    tiny_vq16_config,
    vq_state_for_janus,
)
from csd.adapters.llamagen_gpt import checkpoint_state
from csd.drafters.chain import ChainDrafter
from csd.engine import JacobiEngine
from csd.processors import TargetPipeline
from csd.ragged import reference_logits
from csd.slot import Request
from tests.helpers import (
    check_windows_against_reference,
    chi_square_pvalue,
    decode_counts,
    exact_sequence_distribution,
)

CAPTIONS = ["a cat", "a lighthouse on a cliff", "x", "two red circles left of a blue square"]
CLASSES = ["3", "7", "0", "9"]


def prompts(kind: str) -> list[str]:
    return CAPTIONS if kind == "t2i" else CLASSES


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_cache_matches_the_no_cache_forward(kind):
    """Windows of different lengths, rollbacks, a refill and an inactive slot on the ragged cache, column for column
    the no-cache forward (t2i: captions of 2 to 12 valid tokens, so different paddings share a batch)."""
    adapter = tiny_llamagen_adapter(kind, seed=1)
    p = prompts(kind)
    check_windows_against_reference(adapter, p[:3], refill=p[3], atol=1e-5, rtol=1e-5)


def greedy_loop(adapter: LlamaGenAdapter, prompt: str) -> list[int]:
    """Argmax of the guided logits, one full no-cache forward per token."""
    pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
    body: list[int] = []
    for _ in range(adapter.layout.length):
        q = pipeline(reference_logits(adapter, prompt, torch.tensor(body, dtype=torch.long)))[-1]
        body.append(int(q.argmax()))
    return body


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_greedy_engine_equals_plain_loop(kind):
    adapter = tiny_llamagen_adapter(kind, seed=2, head_scale=3.0, top_k=1)
    for prompt in prompts(kind)[:2]:
        out = JacobiEngine(adapter, SJD(), ChainDrafter(window=1)).generate(prompt, seed=0)
        assert out.tokens.tolist() == greedy_loop(adapter, prompt)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_batch_of_three_equals_batch_of_one(kind):
    adapter = tiny_llamagen_adapter(kind, seed=3, head_scale=3.0)
    reqs = [Request(prompts(kind)[i % 4], seed=11 * i, key=i) for i in range(5)]
    runs = {}
    for batch in (1, 3):
        engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=4), batch_size=batch)
        with decode_counts(engine) as counts:
            runs[batch] = {req.key: gen.tokens.tolist() for req, gen in engine.generate_many(reqs)}
        if batch == 3:
            assert counts.batched > 0 and counts.rollbacks > 0
    assert runs[1] == runs[3]


@pytest.mark.slow
def test_compiled_step_is_token_identical():
    """``engine.compile=true`` (the aot_eager backend: inductor's full-graph trace without code generation): a t2i
    batch of three, the padding flag included, gives the eager tokens with two graphs and no recompilation."""
    from csd.fast import CompiledStep

    torch.compiler.reset()
    adapter = tiny_llamagen_adapter("t2i", seed=3, head_scale=3.0)
    reqs = [Request(CAPTIONS[i % 4], seed=5 * i, key=i) for i in range(4)]
    compiled = CompiledStep(adapter, backend="aot_eager")
    runs = {}
    for step in (None, compiled):
        engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=4), batch_size=3, compiled=step)
        runs[step is None] = {req.key: gen.tokens.tolist() for req, gen in engine.generate_many(reqs)}
    assert runs[True] == runs[False]
    with torch.compiler.set_stance("fail_on_recompile"):
        engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=4), batch_size=3, compiled=compiled)
        assert {req.key: gen.tokens.tolist() for req, gen in engine.generate_many(reqs)} == runs[True]


def test_c2i_prompt_is_a_class_id():
    assert class_id("207", 1000) == 207
    for bad in ("a cat", "1000", "-1", ""):
        with pytest.raises(ValueError, match="is not a class id: a class-conditional LlamaGen takes class ids 0 .. 999"):
            class_id(bad, 1000)


def test_cfg_rows_follow_llamagen():
    """c2i: the null class is id num_classes; t2i: the null caption is uncond_embedding under the caption's padding."""
    c2i = tiny_llamagen_adapter("c2i")
    rows = c2i.prompt_inputs("7")
    table = c2i.gpt.cls_embedding.embedding_table.weight
    assert torch.equal(rows[:, 0], table[[7, c2i.config.num_classes]])
    t2i = tiny_llamagen_adapter("t2i")
    rows = t2i.prompt_inputs("a cat")  # 5 bytes + end of sequence: 6 of 12 positions valid, left-padded
    assert rows.shape == (2, 12, 32)
    assert torch.all(rows[:, :6] == 0) and torch.all(rows[:, 6:].abs().sum(-1) > 0)
    null = t2i.gpt.cls_embedding(t2i.gpt.cls_embedding.uncond_embedding[-6:])
    torch.testing.assert_close(rows[1, 6:], null)


def test_vq16_decode_is_deterministic_with_the_right_shape():
    adapter = tiny_llamagen_adapter("c2i", grid=4)
    codes = torch.stack([torch.arange(16), torch.arange(16).flip(0)])
    first, second = adapter.decode_images(codes), adapter.decode_images(codes)
    assert first.shape == (2, 8, 8, 3) and first.dtype == torch.uint8  # two levels: one 2x upsampling
    assert torch.equal(first, second)
    assert not torch.equal(first[0], first[1])


def llamagen_vq_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``JanusVQVAE`` decoder names -> LlamaGen's ``vq_model.py`` names (the inverse of ``vq_state_for_janus``)."""
    out = {}
    for key, value in state.items():
        key = re.sub(r"decoder\.up\.(\d+)\.block\.", r"decoder.conv_blocks.\1.res.", key)
        key = re.sub(r"decoder\.up\.(\d+)\.", r"decoder.conv_blocks.\1.", key)
        for i, name in enumerate(("block_1", "attn_1", "block_2")):
            key = key.replace(f"decoder.mid.{name}.", f"decoder.mid.{i}.")
        out[key] = value
    return out


def test_vq_checkpoint_in_llamagen_layout_loads_strictly():
    config = tiny_vq16_config(4, 16)
    torch.manual_seed(0)
    source = decoder_only(config)
    released = llamagen_vq_layout(source.state_dict())
    assert any(".conv_blocks.1.res.0." in k for k in released) and "decoder.mid.1.q.weight" in released
    released.update({"encoder.conv_in.weight": torch.zeros(1), "quantize.codebook_used": torch.zeros(4)})
    target = decoder_only(config)
    target.load_state_dict(vq_state_for_janus({"model": released}), strict=True)
    codes = torch.arange(16).view(1, 16)
    torch.testing.assert_close(target.decode(codes), source.decode(codes), atol=0, rtol=0)


def hf_layout(state: dict[str, torch.Tensor], heads: int, kv: int, d: int) -> dict[str, torch.Tensor]:
    """Our (the original's) GPT keys -> LANTERN's ``LlamaForCausalLM`` layout."""
    names = {"attention_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attention.wo.weight": "self_attn.o_proj.weight", "feed_forward.w1.weight": "mlp.gate_proj.weight",
             "feed_forward.w3.weight": "mlp.up_proj.weight", "feed_forward.w2.weight": "mlp.down_proj.weight"}
    out = {}
    for key, value in state.items():
        if key == "output.weight":
            out["lm_head.weight"] = value
        elif key.endswith("attention.wqkv.weight"):
            prefix = "model." + key.removesuffix("attention.wqkv.weight") + "self_attn."
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.split([heads * d, kv * d, kv * d]), strict=True):
                out[prefix + name + ".weight"] = part
        else:
            layer = re.match(r"(layers\.\d+\.)(.*)", key)
            name = layer.group(1) + names[layer.group(2)] if layer else key.replace("tok_embeddings", "embed_tokens")
            out["model." + name] = value
    return out


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
def test_checkpoints_load_in_both_layouts(kind, tmp_path):
    """The released ``.pt`` layout (wrapped in ``model``, with a pickled rotary table and training arguments) and
    LANTERN's HF layout (a directory of safetensors) load strictly, to the same logits."""
    from argparse import Namespace

    from safetensors.torch import save_file

    adapter = tiny_llamagen_adapter(kind, seed=4)
    state = adapter.gpt.state_dict()
    torch.save({"model": {**state, "freqs_cis": torch.zeros(3)}, "args": Namespace(gpt_model="GPT-B")}, tmp_path / "gpt.pt")
    c = adapter.config
    (tmp_path / "hf").mkdir()
    save_file(hf_layout(state, c.num_attention_heads, c.num_key_value_heads, c.attention_head_dim),
              tmp_path / "hf" / "model.safetensors")
    assert set(checkpoint_state(torch.load(tmp_path / "gpt.pt", weights_only=False))) == set(state)
    prompt, ids = prompts(kind)[0], torch.tensor([1, 2, 3])
    expected = reference_logits(adapter, prompt, ids)
    for path in (tmp_path / "gpt.pt", tmp_path / "hf"):
        loaded = LlamaGenAdapter(load_gpt(c, str(path)), adapter.vq, adapter.sampling, adapter.encode_caption)
        torch.testing.assert_close(reference_logits(loaded, prompt, ids), expected, atol=0, rtol=0)


def test_a_wrong_checkpoint_names_the_keys(tmp_path):
    adapter = tiny_llamagen_adapter("c2i")
    state = adapter.gpt.state_dict()
    state.pop("norm.weight")
    torch.save({"model": {**state, "extra.weight": torch.zeros(1)}}, tmp_path / "gpt.pt")
    with pytest.raises(RuntimeError, match=r"(?s)Missing key.*norm\.weight.*Unexpected key.*extra\.weight"):
        load_gpt(adapter.config, str(tmp_path / "gpt.pt"))


# ------------------------------------------------------------------------------------------ lossless (chi-square)

N_SAMPLES = 1500


@pytest.fixture(scope="module")
def two_by_two():
    # 2x2 tokens over 3 codes: 81 sequences (entropy 2.8 nats of log 81 = 4.4), CFG rows; measured over 50 images
    # (SJD, window 4): 88 rejections and rollbacks, 40 of a carried draft (the targets move with the previous token)
    adapter = tiny_llamagen_adapter("c2i", grid=2, codebook=3, seed=6, head_scale=0.3, guidance_scale=2.0)
    return adapter, exact_sequence_distribution(adapter, "7")


def sample_counts(adapter, rule, offset: int) -> Counter:
    engine = JacobiEngine(adapter, rule, ChainDrafter(window=4))
    return Counter(tuple(engine.generate("7", seed=offset + s).tokens.tolist()) for s in range(N_SAMPLES))


@pytest.mark.statistical
@pytest.mark.slow
def test_sjd_is_lossless_on_llamagen(two_by_two):
    adapter, probs = two_by_two
    assert max(probs.values()) < 0.5
    engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=4))
    with decode_counts(engine) as counts:
        for s in range(50):
            engine.generate("7", seed=s)
    assert counts.rejections >= 20 and counts.carried_rejections >= 5
    assert chi_square_pvalue(sample_counts(adapter, SJD(), 0), probs) > 1e-3


@pytest.mark.statistical
@pytest.mark.slow
def test_a_relaxed_rule_is_detected_on_llamagen(two_by_two):
    adapter, probs = two_by_two
    assert chi_square_pvalue(sample_counts(adapter, Amplify(factor=20.0), 10_000), probs) < 1e-6


# ------------------------------------------------------------------------------------------ class-id prompts, config


def test_imagenet_class_prompts():
    from csd.data.imagenet import imagenet_class_prompts

    every = imagenet_class_prompts()
    assert len(every) == 1000 and len({p.prompt_id for p in every}) == 1000
    assert (every[207].text, every[207].meta) == ("207", {"class_id": 207, "class_name": "golden retriever"})
    assert [p.text for p in imagenet_class_prompts(3)] == ["0", "1", "2"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["model=llamagen_c2i_tiny", "dataset=smoke"],
     r"^model=llamagen_c2i_tiny is class-conditional: its prompts are ImageNet class ids, but dataset=smoke holds "
     r"captions; use dataset=imagenet_classes$"),
    (["model=llamagen_t2i_tiny", "dataset=imagenet_classes"],
     r"^dataset=imagenet_classes holds class ids, but model=llamagen_t2i_tiny takes captions"),
])
def test_class_ids_and_captions_are_not_mixed(overrides, message):
    from csd.errors import ConfigError
    from csd.validate import validate
    from tests.pipeline.test_config import make_cfg

    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(*overrides))
    validate(make_cfg("model=llamagen_c2i_tiny", "dataset=imagenet_classes"))


@pytest.mark.slow
def test_class_conditional_run_through_the_pipeline(tmp_path):
    """``run.py model=llamagen_c2i_tiny dataset=imagenet_classes``: records carry the class id as the prompt and its
    name in the meta; images are written."""
    from omegaconf import open_dict

    from csd.pipeline import generate_run
    from csd.records import load_records
    from tests.pipeline.test_config import make_cfg

    cfg = make_cfg("model=llamagen_c2i_tiny", "dataset=imagenet_classes", "dataset.n_prompts=2", "method=sjd",
                   "engine.progress=false")
    with open_dict(cfg):
        cfg.run_dir = str(tmp_path)
    generate_run(cfg)
    records = load_records(tmp_path)
    assert [(r["prompt_id"], r["prompt"], r["meta"]["class_name"]) for r in records] == [
        ("class-0000", "0", "tench"), ("class-0001", "1", "goldfish")]
    assert all(len(r["tokens"]) == 16 for r in records)
    assert len(list(tmp_path.rglob("*.png"))) == 2


@pytest.mark.parametrize(("preset", "model", "protocol", "methods"), [
    ("paper_llamagen_t2i", "llamagen_t2i", "sjd", "ar,sjd,sjd_pac,csd"),
    ("paper_llamagen_t2i_lantern", "llamagen_t2i_256", "lantern", "ar,sjd,lantern"),
])
def test_paper_presets_compose_and_validate(preset, model, protocol, methods, tmp_path):
    """The LlamaGen table presets: the published setting's model, protocol and caption rule; every swept method and
    the extra runs their files name (ZipAR; SJD and LANTERN on a drafter folder, checked for its files at config
    time) validate."""
    from hydra import compose, initialize_config_dir

    from csd.presets import CONF_DIR
    from csd.validate import validate
    from tests.pipeline.test_config import make_cfg

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    assert cfg.model.name == model and cfg.eval.protocol == protocol and cfg.dataset.caption_rule == protocol
    assert cfg.hydra.sweeper.params.method == methods and cfg.logger.group == preset
    if protocol == "lantern":  # LANTERN's sampling, not the model preset's (SJD's)
        assert (cfg.model.guidance_scale, cfg.model.top_k, cfg.model.gpt_ckpt) == (3.0, 2000, "LlamaGen-T2I")
    (tmp_path / "config.json").write_text('{"input_type": "t2i"}')
    (tmp_path / "pytorch_model.bin").write_text("")
    head = f"drafter.head={tmp_path}"
    extra = [("method=sjd", "drafter=zipar")] if protocol == "sjd" else [("method=sjd", "drafter=eagle", head),
                                                                       ("method=lantern", "drafter=eagle", head)]
    for overrides in [(f"method={m}",) for m in methods.split(",")] + extra:
        validate(make_cfg(f"experiment={preset}", *overrides))
