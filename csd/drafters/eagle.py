"""EAGLE-style draft head (docs/ALGORITHMS.md, "EAGLE: a trained draft head"; training: docs/DRAFT_HEADS.md).

The head is one Llama decoder layer over ``fc([e(x_{t+1}); f_t])``: ``e`` the target's input embedding of the next
token, ``f_t`` the target's last hidden state at position ``t`` (after its final norm, what its output head reads).
Its output ``f'_{t+1}`` goes through the **target's own output head**: ``head(f'_{t+1})`` are the raw draft logits of
the token after ``x_{t+1}``. The head keeps a small KV cache of its own (a :class:`csd.ragged.RaggedCache` with the
target's rows: one per CFG row of each slot) over the committed pairs ``(x_{t+1}, f_t)``.

One iteration of an image at ``n`` committed tokens: the pairs committed by the last forward (the target's features
of that window's anchor and accepted drafts, each with the token committed after it) enter the head's cache in one
head forward, whose last output is the first draft's feature; each further draft feeds ``(draft, f')`` back (the
head's own predicted feature), ``gamma = window - 1`` drafts in ``gamma`` head forwards. Each draft's recorded law
``p`` is the head's logits through the target's own processors (``csd.processors.TargetPipeline``: CFG rows
combined, temperature, top-k), and the draft is sampled from ``p`` with the image's generator; the chain is then
verified by the chain drafter's code (``ChainDrafter.verify``), so SJD's rule is exactly lossless. The draft entries
are dropped from the head's cache after drafting: it holds the committed pairs only. An image's first window has no
target feature yet and is one AR step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from csd.acceptance import AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.device import to_device
from csd.drafters.base import STAT_KEYS, BodyIds, Proposal, Verified
from csd.drafters.chain import ChainDrafter, ChainWindow
from csd.params import Param
from csd.processors import TargetPipeline
from csd.ragged import RaggedCache
from csd.schema import Int, Str
from csd.verify import exponential_noise, sample_race

if TYPE_CHECKING:
    from csd.engine import Slot

#: the decoder-layer sizes a head file stores (the head's width is the target's)
HEAD_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps")
TRAIN_HINT = "train one with `python experiments/train_drafter.py model=<name>` (docs/DRAFT_HEADS.md)"


def head_config(decoder_config: Any) -> LlamaConfig:
    """One Llama decoder layer as wide as the target's decoder (``decoder_config``: its transformers config)."""
    sizes = {key: getattr(decoder_config, key, None) for key in HEAD_SIZES}
    sizes["head_dim"] = sizes["head_dim"] or decoder_config.hidden_size // decoder_config.num_attention_heads
    return layer_config(sizes)


def layer_config(sizes: dict[str, Any]) -> LlamaConfig:
    """The transformers config of one decoder layer of ``sizes`` (:data:`HEAD_SIZES`)."""
    return LlamaConfig(**sizes, num_hidden_layers=1, vocab_size=1, max_position_embeddings=8192, bos_token_id=None,
                       eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")


class EagleHead(nn.Module):
    """``f'_{t+1} = Layer(fc([e(x_{t+1}); f_t]))`` (docs/ALGORITHMS.md, "EAGLE: a trained draft head"): the layer's
    input norm is dropped (its input mixes already-normalised features, as in EAGLE's released head) and there is no
    final norm (``f'`` regresses the target's normalised features)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache: RaggedCache | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``embeds, features [N, q, D]`` -> ``f' [N, q, D]``; without a cache, a causal pass over whole sequences
        (training), else the positions and mask ``cache.extend`` returned."""
        hidden = self.fc(torch.cat([embeds, features], dim=-1))
        if cache is None:
            q = hidden.shape[1]
            position_ids = torch.arange(q, device=hidden.device)[None]
            future = torch.ones((q, q), dtype=torch.bool, device=hidden.device).triu(1)
            attention_mask = torch.zeros((q, q), dtype=hidden.dtype, device=hidden.device)
            attention_mask = attention_mask.masked_fill(future, torch.finfo(hidden.dtype).min)[None, None]
        return self.layer(hidden, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                          position_embeddings=self.rotary(hidden, position_ids))


def save_head(head: EagleHead, path: str | Path, meta: dict[str, Any]) -> None:
    """Write ``head`` (its sizes, fp32 weights and ``meta``: what it was trained on) to ``path``."""
    sizes = {key: getattr(head.config, key) for key in HEAD_SIZES}
    state = {k: v.detach().float().cpu() for k, v in head.state_dict().items()}
    torch.save({"sizes": sizes, "state": state, "meta": meta}, path)


def load_head(path: str | Path, adapter: ModelAdapter) -> EagleHead:
    """The head stored at ``path`` on ``adapter``'s device and dtype; one line if it does not fit the target."""
    stored = torch.load(path, map_location="cpu", weights_only=True)
    width = adapter.decoder().config.hidden_size
    if stored["sizes"]["hidden_size"] != width:
        raise ValueError(f"drafter.head={path} was trained for hidden size {stored['sizes']['hidden_size']}, but the "
                         f"target's is {width}: {TRAIN_HINT}")
    head = EagleHead(layer_config(stored["sizes"]))
    head.load_state_dict(stored["state"])
    decoder = adapter.decoder()
    return head.to(device=decoder.device, dtype=decoder.dtype).eval()


@dataclass
class EagleState:
    """An image's pairs not yet in the head's cache: token ids ``[m]`` and the target features before them
    ``[cfg rows, m, D]``; ``new``: the head's cache rows still hold the previous image; ``window``: this
    iteration's chain window. No Gumbel sharing."""

    ids: torch.Tensor
    features: torch.Tensor | None
    new: bool = True
    window: ChainWindow | None = None
    shared: None = None


class EagleDrafter(ChainDrafter):
    """A chain of ``window - 1`` drafts from a trained EAGLE head (module docstring), verified as a chain window."""

    name = "eagle"
    reads_features = True
    PARAMS = {
        "window": Param(Int(min=2), 5, "L: the last committed token + L - 1 drafts of the head (gamma = L - 1)"),
        "head": Param(Str(null="the model's shipped head (model=toy)"), None,
                      "the trained head's file (experiments/train_drafter.py)"),
    }

    def check_params(self) -> None:
        if self.head is not None and not Path(self.head).is_file():
            raise ValueError(f"drafter.head={self.head}: no such file; {TRAIN_HINT}, or leave drafter.head=null for "
                             "model=toy's shipped head")

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        return "drafter=eagle decodes on the eager cache: set engine.compile=false" if compiled else None

    def model_problem(self, adapter_class: type[ModelAdapter]) -> str | None:
        if not adapter_class.exposes_features():
            return (f"drafter=eagle reads the target's hidden states, which {adapter_class.__name__} does not expose "
                    "(features_step / head / embed)")
        if self.head is None and adapter_class.eagle_head is None:
            return f"drafter.head=null: {adapter_class.__name__} ships no EAGLE head; {TRAIN_HINT} and pass drafter.head=<file>"
        return None

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        problem = self.model_problem(type(adapter))
        if problem is not None:
            raise ValueError(problem)
        self.net = load_head(self.head if self.head is not None else adapter.eagle_head, adapter)
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        self.cfg_rows = 2 if adapter.uses_cfg else 1
        self.cache: RaggedCache | None = None
        self.forwards: list[int] = []

    def start(self, slot: Slot) -> None:
        slot.draft = self.new_state(slot, None)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> EagleState:
        return EagleState(torch.zeros(0, dtype=torch.long, device=self.device), None)

    def propose(self, slots: list[Slot | None]) -> Proposal:
        length, tail = self.adapter.layout.length, self.adapter.layout.jacobi_tail
        rows = [0 if slot is None else 1 if (length - slot.n <= tail or slot.draft.ids.numel() == 0)
                else min(self.window, length - slot.n) for slot in slots]
        drafted = self._draft(slots, [max(r - 1, 0) for r in rows])
        for slot, r, (drafts, probs) in zip(slots, rows, drafted, strict=True):
            if slot is not None:
                ids = torch.cat([self.anchor(slot), self.body(drafts, slot.n)])
                slot.draft.window = ChainWindow(r, drafts, probs, ids)
        return super().propose(slots)  # the chain's padding of the windows :meth:`_window` returns

    def _window(self, slot: Slot) -> ChainWindow:
        return slot.draft.window

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """The chain's verification, plus each image's head forwards of this iteration (``drafter_forwards``)."""
        verified = super().verify(rule, slots, proposal, target, target_entropy)
        verified.stats[:, STAT_KEYS.index("drafter_forwards")] += to_device(self.forwards, self.device)
        return verified

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """The ``m`` committed tokens join the pending pairs, each with the target feature of the window entry
        before it (the anchor's for the first): ``(x_{n+j}, f_{n+j-1})``, ``j < m``."""
        for b, (slot, w, m) in enumerate(zip(slots, proposal.windows, verified.counts, strict=True)):
            if w is None:
                continue
            state, features = slot.draft, proposal.features[b, :, :m]
            state.ids = torch.cat([state.ids, self.body(verified.tokens[b, :m], slot.n)])
            state.features = features if state.features is None else torch.cat([state.features, features], dim=1)

    def sample_drafts(self, probs: torch.Tensor, slots: list[Slot | None], wanted: list[bool]) -> torch.Tensor:
        """One draft index per slot from its law ``probs [B, V]`` (the recorded ``p``), with the slot's generator."""
        noise = torch.stack([exponential_noise((self.vocab,), slot.generator, self.device) if want
                             else torch.ones(self.vocab, device=self.device) for slot, want in zip(slots, wanted, strict=True)])
        return sample_race(probs, noise)

    def _draft(self, slots: list[Slot | None], gammas: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every slot's ``gammas[b]`` drafts ``[gamma]`` and their recorded laws ``[gamma, V]`` (batched head
        forwards: the pending pairs, then one draft at a time); the head's cache keeps the committed pairs only."""
        self.forwards = list(gammas)
        empty = (torch.zeros(0, dtype=torch.long, device=self.device),
                 torch.zeros((0, self.vocab), dtype=torch.float32, device=self.device))
        if not any(gammas):
            return [empty] * len(slots)
        r = self.cfg_rows
        feature = self._ingest(slots, gammas)
        drafts, probs = [], []
        for i in range(max(gammas)):
            raw = self.adapter.head(feature).view(len(slots), r, 1, -1)
            p = self.pipeline(raw)[:, 0]
            x = self.sample_drafts(p, slots, [i < g for g in gammas])
            drafts.append(x)
            probs.append(p)
            more = [i + 1 < g for g in gammas]
            if any(more):
                ids = torch.cat([self.body(x[b : b + 1], slot.n + i) if more[b] else x[b : b + 1]
                                 for b, slot in enumerate(slots)])
                embeds = self.adapter.embed(ids.view(-1, 1)).repeat_interleave(r, dim=0)
                feature = self._step(embeds, feature, more)
        self.cache.rollback([max(g - 1, 0) for g in gammas for _ in range(r)])  # the drafts' entries
        drafts, probs = torch.stack(drafts, dim=1), torch.stack(probs, dim=1)
        return [(drafts[b, :g], probs[b, :g]) for b, g in enumerate(gammas)]

    def _ingest(self, slots: list[Slot | None], gammas: list[int]) -> torch.Tensor:
        """One head forward of each drafting slot's pending pairs (padded to the longest, the padding rolled back);
        returns each cache row's feature ``f'`` for its first draft ``[B * cfg rows, 1, D]``."""
        r, batch = self.cfg_rows, len(slots)
        self._reset_new(slots)
        counts = [slot.draft.ids.numel() if g else 0 for slot, g in zip(slots, gammas, strict=True)]
        q, width = max(counts), self.net.config.hidden_size
        ids = torch.zeros((batch, q), dtype=torch.long, device=self.device)
        features = torch.zeros((batch, r, q, width), dtype=self.net.fc.weight.dtype, device=self.device)
        for b, (slot, c) in enumerate(zip(slots, counts, strict=True)):
            if c:
                ids[b, :c], features[b, :, :c] = slot.draft.ids, slot.draft.features
                slot.draft.ids, slot.draft.features = slot.draft.ids[:0], slot.draft.features[:, :0]
            else:
                ids[b] = self.body.image_ids[0]
        embeds = self.adapter.embed(ids).repeat_interleave(r, dim=0)
        out = self._step(embeds, features.view(batch * r, q, width), [c > 0 for c in counts])
        self.cache.rollback([q - c if c else 0 for c in counts for _ in range(r)])
        last = to_device([max(c - 1, 0) for c in counts for _ in range(r)], self.device)
        return out[torch.arange(batch * r, device=self.device), last].unsqueeze(1)

    def _step(self, embeds: torch.Tensor, features: torch.Tensor, advance: list[bool]) -> torch.Tensor:
        """One head forward of ``[B * cfg rows, q, D]`` inputs; the slots flagged in ``advance`` grow their rows."""
        positions, mask = self.cache.extend(slice(0, self.cache.rows), embeds.shape[1],
                                            [a for a in advance for _ in range(self.cfg_rows)])
        return self.net(embeds, features, self.cache, positions, mask)

    def _reset_new(self, slots: list[Slot | None]) -> None:
        """The head's cache for ``len(slots)`` slots; a new image's rows start empty."""
        rows = len(slots) * self.cfg_rows
        if self.cache is None or self.cache.rows != rows:
            decoder = self.adapter.decoder()
            capacity = self.adapter.layout.length + 2 * self.window + 16
            self.cache = RaggedCache(self.net.config, rows, capacity, decoder.dtype, decoder.device)
        for b, slot in enumerate(slots):
            if slot is not None and slot.draft.new:
                self.cache.reset(slice(b * self.cfg_rows, (b + 1) * self.cfg_rows))
                slot.draft.new = False
