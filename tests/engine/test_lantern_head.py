"""LANTERN's drafter layout in ``drafter=eagle`` (csd/drafters/lantern_head.py): a drafter written in LANTERN's
layout for the tiny LlamaGens loads with no missing / unexpected key and computes LANTERN's drafter exactly (an
oracle written from its equations: pair-wise 2-D rotary on the unreordered weights), and the same oracle detects a
load without the query / key reordering; bad files get one line; ``method=lantern drafter=eagle drafter.head=<dir>``
decodes from the run config."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from safetensors.torch import save_file

from csd.acceptance import SJD
from csd.adapters.llamagen_gpt import apply_rotary, rotary_angles
from csd.api import Decoder
from csd.cache import RaggedCache
from csd.compose import build_drafter
from csd.drafters.eagle import EagleDrafter, load_head
from csd.drafters.lantern_head import INPUT_TYPES, LAYER_KEYS
from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.slot import Request
from tests.helpers import rejecting_anole, rejecting_janus, rejecting_llamagen


@pytest.fixture(autouse=True)
def tiny_grids(monkeypatch):
    """LANTERN fixes the grid by ``input_type``; the tiny LlamaGens' 4 x 4 grid stands in for it here."""
    monkeypatch.setitem(INPUT_TYPES, "t2i", ("t2i", 4))
    monkeypatch.setitem(INPUT_TYPES, "c2i", ("c2i", 4))


def write_lantern(root: Path, adapter, kind: str, seed: int = 0, bias: bool = True, safetensors: bool = False,
                  extra: dict | None = None) -> dict[str, torch.Tensor]:
    """A seeded drafter in LANTERN's layout (config.json + weights) for ``adapter``; returns its state dict."""
    c = adapter.decoder().config
    d, heads, inter = c.hidden_size, c.num_attention_heads, 3 * c.hidden_size
    g = torch.Generator().manual_seed(seed)
    shapes = {"self_attn.q_proj.weight": (d, d), "self_attn.k_proj.weight": (d, d), "self_attn.v_proj.weight": (d, d),
              "self_attn.o_proj.weight": (d, d), "mlp.gate_proj.weight": (inter, d), "mlp.up_proj.weight": (inter, d),
              "mlp.down_proj.weight": (d, inter), "post_attention_layernorm.weight": (d,)}
    state = {f"layers.0.{k}": torch.randn(s, generator=g) * 0.3 for k, s in shapes.items()}
    state["fc.weight"] = torch.randn((d, 2 * d), generator=g) * 0.3
    if bias:
        state["fc.bias"] = torch.randn(d, generator=g) * 0.1
    state["embed_tokens.weight"] = adapter.decoder().tok_embeddings.weight.detach().clone()
    state.update(extra or {})
    root.mkdir(parents=True, exist_ok=True)
    config = {"hidden_size": d, "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": heads,
              "rms_norm_eps": 1e-6, "vocab_size": adapter.vocab_size, "input_type": kind, "hidden_act": "silu"}
    if not bias:
        config["bias"] = False
    (root / "config.json").write_text(json.dumps(config))
    if safetensors:
        save_file(state, str(root / "model.safetensors"))
    else:
        torch.save(state, root / "pytorch_model.bin")
    return state


def lantern_oracle(state: dict[str, torch.Tensor], target_config, embeds: torch.Tensor, features: torch.Tensor,
                   eps: float = 1e-6) -> torch.Tensor:
    """LANTERN's drafter over causal sequences ``[N, q, D]`` at positions ``0 .. q-1``: ``fc``, attention with
    pair-wise 2-D rotary (zero at the first ``cls_token_num - 1`` positions, then grid cell ``p - cls_token_num + 1``,
    base 10000), residual, RMSNorm, SwiGLU, residual."""
    w = {k.removeprefix("layers.0."): v for k, v in state.items()}
    h = F.linear(torch.cat([embeds, features], -1), w["fc.weight"], w.get("fc.bias"))
    (n, q_len, _), heads = h.shape, target_config.num_attention_heads
    d = h.shape[-1] // heads
    cls = target_config.cls_token_num - 1
    cfg = type(target_config)(**{**target_config.__dict__, "cls_token_num": cls, "rope_base": 10000.0})
    cos, sin = rotary_angles(cfg, torch.arange(q_len).expand(n, q_len))
    q, k, v = (F.linear(h, w[f"self_attn.{p}_proj.weight"]).view(n, q_len, heads, d) for p in "qkv")
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(q_len, q_len, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).flatten(2)
    h = h + F.linear(attn, w["self_attn.o_proj.weight"])
    x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w["post_attention_layernorm.weight"]
    mlp = F.linear(F.silu(F.linear(x, w["mlp.gate_proj.weight"])) * F.linear(x, w["mlp.up_proj.weight"]),
                   w["mlp.down_proj.weight"])
    return h + mlp


@pytest.mark.parametrize(("kind", "bias", "safetensors"), [("t2i", True, False), ("c2i", False, True)])
def test_a_lantern_drafter_loads_and_computes_lanterns_drafter(tmp_path, kind, bias, safetensors):
    adapter = rejecting_llamagen(kind)
    state = write_lantern(tmp_path / "drafter", adapter, kind, bias=bias, safetensors=safetensors)
    head = load_head(tmp_path / "drafter" / ("model.safetensors" if safetensors else "pytorch_model.bin"), adapter)
    assert head.state_dict().keys() == load_head(tmp_path / "drafter", adapter).state_dict().keys()
    c = adapter.decoder().config
    assert head.config.head_dim == c.hidden_size // c.num_attention_heads  # not the t2i cache's padded head
    assert head.pairs.count == c.cls_token_num - 1
    g, q = torch.Generator().manual_seed(1), c.cls_token_num + 8  # the condition pairs and 9 image pairs
    ids = torch.randint(0, adapter.vocab_size, (2, q), generator=g)
    embeds, features = adapter.embed(ids), torch.randn((2, q, c.hidden_size), generator=g)
    with torch.no_grad():
        ours, oracle = head(embeds, features), lantern_oracle(state, c, embeds, features)
    torch.testing.assert_close(ours, oracle, atol=1e-5, rtol=1e-5)
    # negative control: the same weights without the query / key reordering are another drafter
    unordered = {f"layer.{k}": state[f"layers.0.{k}"] for k in LAYER_KEYS}
    head.load_state_dict({**head.state_dict(), **unordered})
    with torch.no_grad():
        assert (head(embeds, features) - oracle).abs().max() > 1e-2


def test_bad_lantern_drafters_get_one_line(tmp_path):
    adapter = rejecting_llamagen("t2i")
    d = adapter.decoder().config.hidden_size
    write_lantern(tmp_path / "extra", adapter, "t2i", extra={"norm.weight": torch.ones(d)})
    with pytest.raises(ValueError, match=r"^drafter.head=.*extra: missing keys \[\], unexpected keys \['norm.weight'\]"):
        load_head(tmp_path / "extra", adapter)
    state = write_lantern(tmp_path / "nobias", adapter, "t2i", bias=True)
    (tmp_path / "nobias" / "config.json").write_text(json.dumps(
        {**json.loads((tmp_path / "nobias" / "config.json").read_text()), "bias": False}))
    with pytest.raises(ValueError, match=r"missing keys \[\], unexpected keys \['fc.bias'\]"):
        load_head(tmp_path / "nobias", adapter)
    write_lantern(tmp_path / "shape", adapter, "t2i", extra={"fc.bias": torch.zeros(d + 1)})
    with pytest.raises(ValueError, match=r"^drafter.head=.*shape: wrong shapes: fc.bias \(\d+,\) \(the head's"):
        load_head(tmp_path / "shape", adapter)
    write_lantern(tmp_path / "embed", adapter, "t2i", extra={"embed_tokens.weight": state["embed_tokens.weight"][:3]})
    with pytest.raises(ValueError, match=r"embed_tokens.weight is \(3, \d+\), the target's input embedding is"):
        load_head(tmp_path / "embed", adapter)
    write_lantern(tmp_path / "vocab", adapter, "t2i")
    config = json.loads((tmp_path / "vocab" / "config.json").read_text())
    (tmp_path / "vocab" / "config.json").write_text(json.dumps({**config, "vocab_size": 17}))
    with pytest.raises(ValueError, match=r"^drafter.head=.*vocab/pytorch_model.bin: the drafter has \(hidden size, heads, vocab\) = "
                                         r"\(32, 2, 17\), the target \(32, 2, 16\)$"):
        load_head(tmp_path / "vocab" / "pytorch_model.bin", adapter)
    write_lantern(tmp_path / "c2i", adapter, "c2i")
    with pytest.raises(ValueError, match=r"input_type='c2i' drafts for \(kind, grid\) = \('c2i', 4\), the target is"):
        load_head(tmp_path / "c2i", adapter)
    with pytest.raises(ValueError, match=r"is a LANTERN LlamaGen drafter; it drafts for model=llamagen_\*"):
        load_head(tmp_path / "extra", rejecting_janus())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds config.json and .* `hf download jadohu/llamagen_drafter --local-dir"):
        build_drafter(OmegaConf.create({"name": "eagle", "_target_": "csd.drafters.EagleDrafter",
                                        "head": str(tmp_path / "empty")}))


def test_the_head_cache_turns_each_entry_by_its_grid_cell(tmp_path):
    """Decoding feeds the head through its cache in pieces (pending pairs, then one draft at a time): the outputs
    equal the one causal pass the oracle checked, so each cache index gets its grid cell's rotary."""
    adapter = rejecting_llamagen("t2i")
    write_lantern(tmp_path / "drafter", adapter, "t2i")
    head, c = load_head(tmp_path / "drafter", adapter), adapter.decoder().config
    g = torch.Generator().manual_seed(2)
    k = head.pairs.count  # then 9 image pairs: the pending pairs with 3 image pairs, 1, 5
    embeds, features = (torch.randn((1, k + 9, c.hidden_size), generator=g) for _ in range(2))
    cache = RaggedCache(head.config, 1, k + 16, torch.float32, torch.device("cpu"))
    pieces = []
    with torch.no_grad():
        for a, b in ((0, k + 3), (k + 3, k + 4), (k + 4, k + 9)):
            positions, mask = cache.extend(slice(0, 1), b - a)
            pieces.append(head(embeds[:, a:b], features[:, a:b], cache, positions, mask))
        torch.testing.assert_close(torch.cat(pieces, dim=1), head(embeds, features), atol=1e-5, rtol=1e-5)


class RecordingDrafter(EagleDrafter):
    """Keeps every iteration's recorded draft laws."""

    def _draft(self, slots, gammas, starts):
        drafted = super()._draft(slots, gammas, starts)
        self.laws = [*getattr(self, "laws", []), drafted[0][1]]
        return drafted


@pytest.mark.parametrize(("kind", "prompt"), [("t2i", "a red apple"), ("c2i", "7")])
def test_decoding_drafts_from_lanterns_drafter_law(tmp_path, kind, prompt):
    """The first draft after image token 0 is recorded with the law of LANTERN's drafter (the oracle) over its pairs:
    (code 0, the target's feature of prompt position p) for p < cls_token_num - 1, then (x_0, the last prompt
    position's feature), through the target's head and processors."""
    adapter = rejecting_llamagen(kind)
    state = write_lantern(tmp_path / "drafter", adapter, kind)
    drafter = RecordingDrafter(window=3, head=str(tmp_path / "drafter"))
    gen = JacobiEngine(adapter, SJD(), drafter).generate(prompt, 0)
    c, prompt = adapter.decoder().config, adapter.prompt_inputs(prompt)
    with torch.no_grad():
        x0 = gen.tokens[:1].expand(prompt.shape[0], 1)
        f = adapter.features_step(torch.cat([prompt, adapter.embed(x0)], dim=1), None)[:, : c.cls_token_num]
        ids = torch.cat([torch.zeros((prompt.shape[0], c.cls_token_num - 1), dtype=torch.long), x0], dim=1)
        out = lantern_oracle(state, c, adapter.embed(ids), f)[:, -1:]
        law = drafter.pipeline(adapter.head(out).view(1, prompt.shape[0], 1, -1))[0, 0]
    assert drafter.laws[0].numel() == 0  # the first window is one AR step
    torch.testing.assert_close(drafter.laws[1][0], law, atol=1e-5, rtol=1e-4)


def test_method_lantern_decodes_with_a_lantern_drafter(tmp_path):
    """``method=lantern drafter=eagle drafter.head=<dir> model=llamagen_t2i_tiny`` (the run config ``run.py``
    composes): the decoder drafts with the LANTERN head (one head forward per draft), drafts get accepted."""
    write_lantern(tmp_path / "drafter", rejecting_llamagen("t2i"), "t2i")
    decoder = Decoder("llamagen_t2i_tiny", "lantern", drafter="eagle", **{"drafter.head": str(tmp_path / "drafter")})
    gens = [decoder.generate("a red apple", seed=s)[1] for s in range(4)]
    assert all(g.tokens.numel() == 16 for g in gens)
    assert all(g.stats["drafter_forwards"] == g.stats["drafts_proposed"] > 0 for g in gens)
    assert sum(g.stats["drafts_accepted"] for g in gens) > 0


# --------------------------------------------------------------------------------------- LANTERN's Anole drafter

ANOLE_LAYER_SHAPES = {  # the tiny Anole's sizes: hidden 32, 4 heads of 8, 2 key-value heads, MLP 64
    "self_attn.q_proj.weight": (32, 32), "self_attn.k_proj.weight": (16, 32), "self_attn.v_proj.weight": (16, 32),
    "self_attn.o_proj.weight": (32, 32), "self_attn.q_norm.weight": (4, 8), "self_attn.q_norm.bias": (4, 8),
    "self_attn.k_norm.weight": (2, 8), "self_attn.k_norm.bias": (2, 8), "mlp.gate_proj.weight": (64, 32),
    "mlp.up_proj.weight": (64, 32), "mlp.down_proj.weight": (32, 64), "input_layernorm.weight": (32,),
    "post_attention_layernorm.weight": (32,)}


def write_anole_drafter(root: Path, adapter, seed: int = 0, extra: dict | None = None,
                        config: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """A seeded drafter in the layout of LANTERN's Anole drafter (its ``config.json`` keys, ``pytorch_model.bin``)
    for the tiny Anole; returns its state dict and config."""
    c = adapter.decoder().config
    g = torch.Generator().manual_seed(seed)
    state = {f"layers.0.{k}": torch.randn(s, generator=g) * 0.3 + (1.0 if k.endswith("norm.weight") else 0.0)
             for k, s in ANOLE_LAYER_SHAPES.items()}
    state["fc.weight"] = torch.randn((32, 64), generator=g) * 0.3
    state["fc.bias"] = torch.randn(32, generator=g) * 0.1
    state["embed_tokens.weight"] = adapter.decoder().get_input_embeddings().weight.detach().clone()
    state.update(extra or {})
    conf = {"architectures": ["ChameleonForConditionalGeneration"], "model_type": "chameleon", "hidden_size": 32,
            "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-5, "rope_theta": 1000.0, "rope_scaling": None, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "vocab_size": c.vocab_size, **(config or {})}
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(conf))
    torch.save(state, root / "pytorch_model.bin")
    return state, conf


def anole_oracle(state: dict[str, torch.Tensor], conf: dict, embeds: torch.Tensor, features: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """LANTERN's Anole drafter (``cnets_anole.py``) over one causal sequence ``[1, q, D]`` at rotary positions
    ``positions [q]``: ``fc``; RMSNorm; q / k / v; per-head LayerNorm of q and k over the head's channels (eps
    1e-5, no affine, then the head's weight and bias); 1-D rotary of the halves, base ``rope_theta``; causal
    attention, key-value heads shared by consecutive query heads; residual; RMSNorm, SwiGLU, residual."""
    w, eps = {k.removeprefix("layers.0."): v for k, v in state.items()}, conf["rms_norm_eps"]
    heads, kv, d = conf["num_attention_heads"], conf["num_key_value_heads"], conf["hidden_size"] // conf["num_attention_heads"]

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rotate(x, cos, sin):
        return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin

    h = F.linear(torch.cat([embeds, features], -1), w["fc.weight"], w["fc.bias"])
    x, q_len = rms(h, w["input_layernorm.weight"]), h.shape[1]
    q = F.linear(x, w["self_attn.q_proj.weight"]).view(q_len, heads, d)
    k = F.linear(x, w["self_attn.k_proj.weight"]).view(q_len, kv, d)
    v = F.linear(x, w["self_attn.v_proj.weight"]).view(q_len, kv, d)
    q = F.layer_norm(q, (d,), eps=1e-5) * w["self_attn.q_norm.weight"] + w["self_attn.q_norm.bias"]
    k = F.layer_norm(k, (d,), eps=1e-5) * w["self_attn.k_norm.weight"] + w["self_attn.k_norm.bias"]
    angles = positions[:, None].float() / conf["rope_theta"] ** (torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(q_len, q_len, dtype=torch.bool).triu(1), float("-inf"))
    h = h + F.linear(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).flatten(1), w["self_attn.o_proj.weight"])[None]
    y = rms(h, w["post_attention_layernorm.weight"])
    return h + F.linear(F.silu(F.linear(y, w["mlp.gate_proj.weight"])) * F.linear(y, w["mlp.up_proj.weight"]),
                        w["mlp.down_proj.weight"])


def test_lanterns_anole_drafter_loads_and_computes_its_layer(tmp_path):
    """Every key of LANTERN's Anole layout maps (no missing, none unexpected: ``load_state_dict`` is strict) and the
    head computes the oracle; the same oracle detects the head's Llama layer, which drops the input norm."""
    adapter = rejecting_anole()
    state, conf = write_anole_drafter(tmp_path / "drafter", adapter)
    head = load_head(tmp_path / "drafter", adapter)
    assert set(head.state_dict()) == {"fc.weight", "fc.bias"} | {f"layer.{k}" for k in ANOLE_LAYER_SHAPES}
    assert head.pairs.count is None  # each row opens with its own prompt
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, adapter.decoder().config.vocab_size, (1, 12), generator=g)
    embeds, features = adapter.embed(ids), torch.randn((1, 12, 32), generator=g)
    with torch.no_grad():
        oracle = anole_oracle(state, conf, embeds, features, torch.arange(12))
        torch.testing.assert_close(head(embeds, features), oracle, atol=1e-5, rtol=1e-5)
        head.layer.input_layernorm = torch.nn.Identity()  # negative control
        assert (head(embeds, features) - oracle).abs().max() > 1e-2


class DraftRecorder(EagleDrafter):
    """Keeps every iteration's drafts and recorded draft laws."""

    def _draft(self, slots, gammas, starts):
        drafted = super()._draft(slots, gammas, starts)
        self.drafted = [*getattr(self, "drafted", []), drafted[0]]
        return drafted


def anole_laws(adapter, drafter, state, conf, prompt: str, x0: torch.Tensor, draft: torch.Tensor,
               shift: int = 1) -> torch.Tensor:
    """The oracle's laws ``[2, V]`` of an image's first two drafts: per CFG row, its pairs (``prompt[t + shift]``,
    the target's feature of prompt position ``t``) at positions ``t`` (LANTERN's pairing: ``shift=1``; the last id
    is ``x_0``), then ``(draft, f')``, each row's last output through the target's head and processors."""
    outs = [[], []]
    for row in adapter.prompt_inputs(prompt):
        seq = torch.cat([row, x0, draft])  # the target's ids; f of prompt + x0, the draft's pair needs f' instead
        f = adapter.features_step(seq[None, : row.numel()], None, None, None)
        ids = seq[shift : row.numel() + shift][None]
        out = anole_oracle(state, conf, adapter.embed(ids), f, torch.arange(row.numel()))
        nxt = anole_oracle(state, conf, adapter.embed(torch.cat([ids, draft[None]], 1)),
                           torch.cat([f, out[:, -1:]], 1), torch.arange(row.numel() + 1))
        outs[0].append(out[0, -1])
        outs[1].append(nxt[0, -1])
    return torch.stack([drafter.pipeline(adapter.head(torch.stack(o)).view(1, 2, 1, -1))[0, 0] for o in outs])


def test_decoding_drafts_from_lanterns_anole_drafter_law(tmp_path):
    """The first two drafts after image token 0 are recorded with the laws of LANTERN's Anole drafter over each
    CFG row's pairs (conditional: BOS, caption, end of turn, begin image; unconditional: BOS, begin image), the
    first through one head forward of the pending pairs, the second through the head's cache; the oracle with the
    pairs one id off (``(prompt[t], f_t)``) is another law (negative control)."""
    adapter = rejecting_anole()
    state, conf = write_anole_drafter(tmp_path / "drafter", adapter)
    drafter = DraftRecorder(window=3, head=str(tmp_path / "drafter"))
    gen = JacobiEngine(adapter, SJD(), drafter).generate("a red apple", 0)
    (first, _), (drafts, laws) = drafter.drafted[:2]
    assert first.numel() == 0 and laws.shape[0] == 2  # the first window is one AR step
    x0, draft = gen.tokens[:1], adapter.image_token_ids[drafts[:1]]  # token ids (the drafts: code indices)
    with torch.no_grad():
        oracle = anole_laws(adapter, drafter, state, conf, "a red apple", x0, draft)
        torch.testing.assert_close(laws, oracle, atol=1e-5, rtol=1e-4)
        off_by_one = anole_laws(adapter, drafter, state, conf, "a red apple", x0, draft, shift=0)
    assert (off_by_one[0] - laws[0]).abs().max() > 1e-3


def test_bad_anole_drafters_get_one_line(tmp_path):
    adapter = rejecting_anole()
    write_anole_drafter(tmp_path / "extra", adapter, extra={"norm.weight": torch.ones(32)})
    with pytest.raises(ValueError, match=r"^drafter.head=.*extra: missing keys \[\], unexpected keys \['norm.weight'\]"):
        load_head(tmp_path / "extra", adapter)
    state, _ = write_anole_drafter(tmp_path / "no_qk_norm", adapter)
    torch.save({k: v for k, v in state.items() if "k_norm" not in k}, tmp_path / "no_qk_norm" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"missing keys \['layers.0.self_attn.k_norm.bias', 'layers.0.self_attn.k_norm"
                                         r".weight'\], unexpected keys \[\]"):
        load_head(tmp_path / "no_qk_norm", adapter)
    write_anole_drafter(tmp_path / "shape", adapter, extra={"layers.0.self_attn.q_norm.weight": torch.ones(1, 8)})
    with pytest.raises(ValueError, match=r"^drafter.head=.*shape: wrong shapes: layer.self_attn.q_norm.weight \(1, 8\) "
                                         r"\(the head's: \(4, 8\)\)$"):
        load_head(tmp_path / "shape", adapter)
    write_anole_drafter(tmp_path / "embed", adapter, extra={"embed_tokens.weight": torch.zeros(3, 32)})
    with pytest.raises(ValueError, match=r"embed_tokens.weight is \(3, 32\), the target's input embedding is \(286, 32\)$"):
        load_head(tmp_path / "embed", adapter)
    write_anole_drafter(tmp_path / "heads", adapter, config={"num_key_value_heads": 4})
    with pytest.raises(ValueError, match=r"^drafter.head=.*heads: the drafter has \(hidden size, heads, key-value heads, "
                                         r"vocab\) = \(32, 4, 4, 286\), the target \(32, 4, 2, 286\)$"):
        load_head(tmp_path / "heads", adapter)
    write_anole_drafter(tmp_path / "scaled", adapter, config={"rope_scaling": {"type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"config.json lacks \[\] or sets rope_scaling=\{'type': 'linear'"):
        load_head(tmp_path / "scaled", adapter)
    with pytest.raises(ValueError, match=r"is LANTERN's Anole drafter \(model_type chameleon\); it drafts for "
                                         r"model=anole_7b / anole_tiny, not LlamaGenAdapter$"):
        load_head(tmp_path / "extra", rejecting_llamagen("t2i"))
    with pytest.raises(ConfigError, match=r"is LANTERN's Anole drafter .* not LlamaGenAdapter"):  # before it loads
        Decoder("llamagen_t2i_tiny", "lantern", drafter="eagle", **{"drafter.head": str(tmp_path / "extra")})
    write_lantern(tmp_path / "llamagen", rejecting_llamagen("t2i"), "t2i")
    with pytest.raises(ValueError, match=r"is a LANTERN LlamaGen drafter; it drafts for model=llamagen_\*, not AnoleAdapter"):
        load_head(tmp_path / "llamagen", adapter)
    write_anole_drafter(tmp_path / "unknown", adapter, config={"model_type": "llama"})
    with pytest.raises(ConfigError, match=r"its config.json has neither input_type .* nor model_type 'chameleon'"):
        build_drafter(OmegaConf.create({"name": "eagle", "_target_": "csd.drafters.EagleDrafter",
                                        "head": str(tmp_path / "unknown")}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"model=anole_7b: `hf download jadohu/anole_drafter --local-dir <dir>`"):
        build_drafter(OmegaConf.create({"name": "eagle", "_target_": "csd.drafters.EagleDrafter",
                                        "head": str(tmp_path / "empty")}))


def test_method_lantern_decodes_with_lanterns_anole_drafter(tmp_path):
    """``method=lantern drafter=eagle drafter.head=<dir> model=anole_tiny`` (the run config ``run.py`` composes)
    decodes with the drafter (one head forward per draft); a batch of prompts of other lengths (the head's cache
    grows for the longer one) gives batch 1's tokens."""
    write_anole_drafter(tmp_path / "drafter", rejecting_anole())
    decoder = Decoder("anole_tiny", "lantern", drafter="eagle", **{"drafter.head": str(tmp_path / "drafter")})
    gens = [decoder.generate("a red apple", seed=s)[1] for s in range(2)]
    assert all(g.tokens.numel() == 9 for g in gens)
    assert all(g.stats["drafter_forwards"] == g.stats["drafts_proposed"] > 0 for g in gens)
    adapter, head = rejecting_anole(), str(tmp_path / "drafter")
    requests = [Request(prompt, 0) for prompt in ("a cat", "a red apple", "a dog on a red sofa by the window")]
    one = JacobiEngine(adapter, SJD(), EagleDrafter(window=3, head=head))
    two = JacobiEngine(adapter, SJD(), EagleDrafter(window=3, head=head), batch_size=2)
    batched = {r.prompt: g for r, g in two.generate_many(requests)}
    for r in requests:
        ref = one.generate(r.prompt, r.seed)
        assert batched[r.prompt].tokens.tolist() == ref.tokens.tolist() and batched[r.prompt].stats == ref.stats
