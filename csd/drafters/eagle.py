"""EAGLE-style draft head (docs/ALGORITHMS.md, "EAGLE: a trained draft head"; training: docs/DRAFT_HEADS.md).

The head is one Llama decoder layer over ``fc([e(x_{t+1}); f_t])``: ``e`` the target's input embedding of the next
token, ``f_t`` the target's last hidden state at position ``t`` (after its final norm, what its output head reads).
Its output ``f'_{t+1}`` goes through the **target's own output head**: ``head(f'_{t+1})`` are the raw draft logits of
the token after ``x_{t+1}``. The head keeps a small KV cache of its own (a :class:`csd.cache.RaggedCache` with the
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

``tree`` (docs/ALGORITHMS.md, "Static trees"): a static tree of drafts instead of the chain, built level by level
(each node's children drawn without replacement from its head law, one head forward per level over the level's
nodes with a tree mask over the head's draft entries) and verified by recursive rejection sampling as a tree window
(``csd.drafters.tree_window``, the code SJD-PAC's windows use); batch 1.

``skip`` (VVS, arXiv 2511.13587; docs/ALGORITHMS.md "VVS: verification skipping"): some drafting rounds commit a
candidate path of their drafts truncated to the mean accepted length without a target forward of their own and draft
again after it; the window the target then runs holds the skipped chain and the new drafts (csd.drafters.skip).
Lossy unless ``skip_verify``; chains at any batch size, trees at batch 1. ``skip=none`` decodes as before.
"""

from __future__ import annotations

import functools
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from csd.acceptance import AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.cache import RaggedCache
from csd.device import to_device
from csd.drafters.base import FORWARDS, STAT_KEYS, BodyIds, Proposal, Verified, features_problem
from csd.drafters.chain import ChainDrafter, ChainHead, ChainWindow, verify_chain_batch
from csd.drafters.lantern_head import PromptPairs, is_lantern, lantern_kind, lantern_parts, target_problem
from csd.drafters.skip import (
    VVS_DECAY,
    VVS_INTERVAL,
    VVS_THRESHOLD,
    VVS_WARMUP,
    SkipSchedule,
    SkipState,
    path_similarity,
    reused_features,
)
from csd.drafters.tree_window import TreeWindow, tree_grid, verify_tree_window
from csd.keys import SKIP_POLICIES
from csd.params import Param
from csd.processors import TargetPipeline
from csd.records import COMMIT_ACCEPTED
from csd.schema import Bool, Choice, Float, Int, Str
from csd.tree import Tree, TreeMask, without_replacement
from csd.verify import exponential_noise, sample_race

if TYPE_CHECKING:
    from csd.slot import Slot

#: the decoder-layer sizes a head file stores (the head's width is the target's)
HEAD_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps")
TRAIN_HINT = "train one with `python -m experiments.train_drafter model=<name>` (docs/DRAFT_HEADS.md)"
#: static trees (``drafter.tree``): the children of every node at depth ``d - 1`` for the first depths ``d = 1, 2, ..``
#: (1 below), down to depth ``window - 1`` (docs/ALGORITHMS.md "EAGLE: a trained draft head", Static trees)
STATIC_TREES: dict[str, tuple[int, ...]] = {"chain": (), "binary": (2, 2), "wide": (4, 2)}
#: the skipping keys (``drafter.skip`` and its settings), left out of the recorded settings when ``skip=none``
SKIP_KEYS = ("skip", "skip_interval", "skip_threshold", "skip_decay", "skip_warmup", "skip_verify")
SKIPPED = STAT_KEYS.index("skipped")


def head_config(decoder_config: Any) -> LlamaConfig:
    """One Llama decoder layer as wide as the target's decoder (``decoder_config``: its transformers config), with
    attention heads of the model's own size ``hidden_size / num_attention_heads``: a cache's ``head_dim`` may carry
    extra channels (LlamaGen t2i's padding flags, csd/adapters/llamagen_gpt.py) that belong to the target's cache only."""
    sizes = {key: getattr(decoder_config, key, None) for key in HEAD_SIZES}
    sizes["head_dim"] = decoder_config.hidden_size // decoder_config.num_attention_heads
    return layer_config(sizes)


def layer_config(sizes: dict[str, Any]) -> LlamaConfig:
    """The transformers config of one decoder layer of ``sizes`` (:data:`HEAD_SIZES`)."""
    return LlamaConfig(**sizes, num_hidden_layers=1, vocab_size=1, max_position_embeddings=8192, bos_token_id=None,
                       eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")


class EagleHead(nn.Module):
    """``f'_{t+1} = Layer(fc([e(x_{t+1}); f_t]))`` (docs/ALGORITHMS.md, "EAGLE: a trained draft head"): the layer's
    input norm is dropped (its input mixes already-normalised features, as in EAGLE's released head) and there is no
    final norm (``f'`` regresses the target's normalised features). ``rotary``: the positions' ``(cos, sin)``
    (default: the Llama rotary of the cache index); ``pairs``: the prompt's pairs that open an image's cache (None:
    it starts at the image; a LANTERN drafter's: csd.drafters.lantern_head); ``layer``: another decoder layer of
    ``config`` taking the same arguments, returning ``f'`` (LANTERN's Anole drafter: Chameleon's, its input norm kept)."""

    def __init__(self, config: PretrainedConfig, rotary: nn.Module | None = None, pairs: PromptPairs | None = None,
                 layer: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        if layer is None:
            layer = LlamaDecoderLayer(config, layer_idx=0)
            layer.input_layernorm = nn.Identity()
        self.layer = layer
        self.rotary = rotary if rotary is not None else LlamaRotaryEmbedding(config)
        self.pairs = pairs

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


def is_torch_archive(path: str | Path) -> bool:
    """Whether ``path`` is a file :func:`torch.save` wrote (a zip archive with its pickle, ``<name>/data.pkl``): read from
    the archive's directory only, so a text file or a truncated download is refused before any model loads."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/data.pkl") for name in archive.namelist())


def load_head(path: str | Path, adapter: ModelAdapter) -> EagleHead:
    """The head stored at ``path`` (a file of :func:`save_head`, or a LANTERN drafter: csd.drafters.lantern_head) on
    ``adapter``'s device and dtype; one line if it does not fit the target."""
    if is_lantern(path):  # its fit to the target is checked there
        parts = lantern_parts(path, adapter)
        config = parts.layer.config if parts.layer is not None else layer_config(parts.sizes)
        head, state = EagleHead(config, parts.rotary, parts.pairs, parts.layer), parts.state
    else:
        stored = torch.load(path, map_location="cpu", weights_only=True)
        sizes, state = stored["sizes"], stored["state"]
        width = adapter.decoder().config.hidden_size
        if sizes["hidden_size"] != width:
            raise ValueError(f"drafter.head={path} was trained for hidden size {sizes['hidden_size']}, but the "
                             f"target's is {width}: {TRAIN_HINT}")
        head = EagleHead(layer_config(sizes))
    wrong = [f"{k} {tuple(v.shape)} (the head's: {tuple(head.state_dict()[k].shape)})" for k, v in state.items()
             if k in head.state_dict() and v.shape != head.state_dict()[k].shape]
    if wrong:
        raise ValueError(f"drafter.head={path}: wrong shapes: {'; '.join(wrong)}")
    head.load_state_dict(state)
    decoder = adapter.decoder()
    return head.to(device=decoder.device, dtype=decoder.dtype).eval()


@functools.cache
def static_tree(widths: tuple[int, ...], depth: int) -> Tree:
    """``depth`` levels under the root, every node at depth ``d - 1`` with ``widths[d - 1]`` children (1 past the
    tuple); node order: the spine (the first children, node ``d`` at depth ``d``), then by depth, in branch order."""
    levels = [[()]]
    for d in range(depth):
        levels.append([b + (k,) for b in levels[-1] for k in range(widths[d] if d < len(widths) else 1)])
    rest = [b for level in levels for b in level if any(b)]
    return Tree.from_branches(tuple([(0,) * d for d in range(depth + 1)] + rest), depth + 1)


@dataclass(frozen=True)
class HeadTree:
    """A static tree window's shape on the device: the tree, the target's mask and verification grid; ``levels[d]``
    its nodes at depth ``d`` in branch order (the children of a level's nodes, parent by parent); ``head``: the mask
    of the head's draft entries, the internal nodes at depths ``1 ..`` in level order (depths, ancestor-or-self)."""

    tree: Tree
    mask: TreeMask
    grid: tuple[torch.Tensor, torch.Tensor]
    grid_of: dict[int, tuple[int, int]]
    levels: list[list[int]]
    head: TreeMask

    @staticmethod
    def build(widths: tuple[int, ...], depth: int, device: torch.device) -> HeadTree:
        tree = static_tree(widths, depth)
        mask = tree.mask(device)
        levels = [sorted((v for v in range(tree.size) if tree.depth(v) == d), key=tree.branches.__getitem__)
                  for d in range(depth + 1)]
        entries = to_device([v for level in levels[1:-1] for v in level], device)
        head = TreeMask(mask.depth[entries], mask.ancestors[entries][:, entries])
        return HeadTree(tree, mask, *tree_grid(tree, device), levels, head)


@dataclass
class EagleState:
    """An image's pairs not yet in the head's cache: token ids ``[m]`` and the target features before them
    ``[cfg rows, m, D]``, after ``prompt``: per CFG row, the prompt's pairs (ids ``[k_r]``, features ``[k_r, D]``) of
    a head that opens with them (``EagleHead.pairs``); ``new``: the head's cache rows still hold the previous image;
    ``window``: this iteration's chain (or static tree) window. No Gumbel sharing. Skipping (``drafter.skip``):
    ``skip`` the image's schedule record, ``recent`` its latest target features ``[cfg rows, k, D]``, ``skipped``
    the length of the skipped chain at the front of this iteration's window (0: none), ``after`` the tree window
    drafted after it (judged alone unless ``skip_verify``)."""

    ids: torch.Tensor
    features: torch.Tensor | None
    new: bool = True
    window: ChainWindow | TreeWindow | None = None
    shared: None = None
    prompt: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    skip: SkipState | None = None
    recent: torch.Tensor | None = None
    skipped: int = 0
    after: TreeWindow | None = None


class EagleDrafter(ChainDrafter):
    """A chain of ``window - 1`` drafts from a trained EAGLE head (module docstring), verified as a chain window; or a
    static tree of them (``tree``), verified by recursive rejection sampling as a tree window (batch 1)."""

    name = "eagle"
    reads_features = True
    PARAMS = {
        "window": Param(Int(min=2), 5, "L: the last committed token + L - 1 drafts of the head (gamma = L - 1)"),
        "head": Param(Str(null="the model's shipped head (model=toy)"), None,
                      "the trained head's file (experiments/train_drafter.py), or a LANTERN drafter's folder"),
        "tree": Param(Choice(options=tuple(STATIC_TREES)), "chain",
                      "the drafts' shape: a chain, or a static tree (binary: 2 children per node at depths 1-2; wide: 4 "
                      "at depth 1, 2 at depth 2) window - 1 deep, each node's children drawn without replacement from "
                      "the head's law"),
        "skip": Param(Choice(options=SKIP_POLICIES), "none",
                      "VVS verification skipping (lossy): none, every skip_interval-th drafting round (uniform), or "
                      "when the tree's candidate paths agree (similarity >= skip_threshold; needs a tree)"),
        "skip_interval": Param(Int(min=2), VVS_INTERVAL, "uniform skipping: skip drafting rounds k = interval, 2 interval, .."),
        "skip_threshold": Param(Float(min=-1.0, max=1.0), VVS_THRESHOLD,
                                "similarity skipping: skip when the paths' weighted cosine similarity is at least this"),
        "skip_decay": Param(Float(gt=0.0), VVS_DECAY, "similarity skipping: the weight decay^l of the paths' depth l"),
        "skip_warmup": Param(Int(min=1), VVS_WARMUP, "no skipping before this many committed tokens"),
        "skip_verify": Param(Bool(), False,
                             "judge the skipped chain in the next forward (true), or commit it unjudged as the released "
                             "code does (false)"),
    }

    def check_params(self) -> None:
        if self.head is not None and not Path(self.head).exists():
            raise ValueError(f"drafter.head={self.head}: no such file; {TRAIN_HINT}, pass a LANTERN drafter's folder "
                             "(docs/DRAFT_HEADS.md), or leave drafter.head=null for model=toy's shipped head")
        if self.head is not None and is_lantern(self.head):
            lantern_kind(self.head)
        elif self.head is not None and not is_torch_archive(self.head):
            raise ValueError(f"drafter.head={self.head} is not a head file (torch.save's zip archive, as "
                             f"experiments/train_drafter.py writes) nor a LANTERN drafter's folder; {TRAIN_HINT}")
        if self.skip == "similarity" and self.tree == "chain":
            raise ValueError("drafter.skip=similarity compares a tree's candidate paths, but drafter.tree=chain has one: "
                             "set drafter.tree=binary or wide, or drafter.skip=uniform")
        self.schedule = SkipSchedule(self.skip, self.skip_interval, self.skip_threshold, self.skip_decay,
                                     self.skip_warmup)

    def params(self) -> dict[str, object]:
        """The drafting settings recorded with every image; ``tree=chain`` is left out, so that chain runs keep the
        records and fingerprints they had before static trees."""
        values = super().params()
        if self.tree == "chain":
            del values["tree"]
        if self.skip == "none":
            for key in SKIP_KEYS:
                del values[key]
        return values

    def forward_entries(self, grid: tuple[int, int], body_len: int) -> int:
        """A window after a skipped chain holds up to ``window - 1`` more entries."""
        return self.window if self.skip == "none" else 2 * self.window - 1

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        if compiled:
            return "drafter=eagle decodes on the eager cache: set engine.compile=false"
        if self.tree != "chain" and batch_size > 1:
            return (f"drafter=eagle with drafter.tree={self.tree} (a tree window) decodes one image at a time: set "
                    f"engine.batch_size=1, got {batch_size}")
        return None

    def model_problem(self, adapter_class: type[ModelAdapter]) -> str | None:
        if problem := features_problem("eagle", adapter_class):
            return problem
        if self.head is None and adapter_class.eagle_head is None:
            return f"drafter.head=null: {adapter_class.__name__} ships no EAGLE head; {TRAIN_HINT} and pass drafter.head=<file>"
        if self.head is not None and is_lantern(self.head):
            return target_problem(self.head, adapter_class)
        return None

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        super().bind(adapter, body, pad)
        self.refuse_model(adapter)
        self.net = load_head(self.head if self.head is not None else adapter.eagle_head, adapter)
        self.pipeline = TargetPipeline.build(adapter.sampling, adapter.raw_image_columns)
        self.cfg_rows = 2 if adapter.uses_cfg else 1
        self.cache: RaggedCache | None = None
        self.forwards: list[int] = []
        #: static trees: per (widths, depth) the window's shape (:class:`HeadTree`)
        self._shapes: dict[tuple[tuple[int, ...], int], HeadTree] = {}

    def start(self, slot: Slot) -> None:
        """A new image's state; a head that opens with prompt pairs (a LANTERN drafter) has them pending, per CFG row
        (``EagleHead.pairs``: one target pass over the prompt)."""
        slot.draft = self.new_state(slot, None)
        if self.net.pairs is not None:
            slot.draft.prompt = self.net.pairs(self.adapter, slot.request.prompt)

    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> EagleState:
        skip = None if self.skip == "none" else SkipState()
        return EagleState(torch.zeros(0, dtype=torch.long, device=self.device), None, skip=skip)

    def propose(self, slots: list[Slot | None]) -> Proposal:
        if self.tree != "chain":
            (slot,) = slots
            slot.draft.skipped, slot.draft.after = 0, None
            w = self._tree_window(slot, slot.n)
            slot.draft.window = w if self.skip == "none" else self._tree_skip(slot, w)
            w = self._window(slot)
            return Proposal(w.ids.unsqueeze(0), [slot.n == 0], [True], w.tree.size, w.mask, [w])
        rows = [0 if slot is None else self._chain_rows(slot.n) for slot in slots]
        drafted = self._draft(slots, [max(r - 1, 0) for r in rows], [0 if slot is None else slot.n for slot in slots])
        for slot, r, (drafts, probs) in zip(slots, rows, drafted, strict=True):
            if slot is not None:
                ids = torch.cat([self.anchor(slot), self.body(drafts, slot.n)])
                slot.draft.window = ChainWindow(r, drafts, probs, ids)
                slot.draft.skipped = 0
        if self.skip != "none":
            self._chain_skip(slots)
        return super().propose(slots)  # the chain's padding of the windows :meth:`_window` returns

    def _chain_rows(self, n: int) -> int:
        """The rows of a chain window at ``n`` committed tokens: 1 for an image's first token and the AR tail."""
        length, tail = self.adapter.layout.length, self.adapter.layout.jacobi_tail
        return 1 if (length - n <= tail or n == 0) else min(self.window, length - n)

    def _skip_length(self, slot: Slot, drafts: int) -> tuple[int, bool]:
        """How many drafts of a path of ``drafts`` a skipped round would commit (``min(L_path, floor(tau))``) and
        whether it can: at least one, and a window with drafts after them."""
        s = min(drafts, slot.draft.skip.mean_accepted())
        return s, s > 0 and self._chain_rows(slot.n + s) > 1

    def _start_skip(self, slot: Slot, ids: torch.Tensor) -> None:
        """The skipped chain's pairs (model ids ``ids [s]``, the latest target features reused) become pending."""
        slot.draft.ids = ids
        slot.draft.features = reused_features(slot.draft.recent, ids.numel())
        slot.draft.skipped = ids.numel()

    def _chain_skip(self, slots: list[Slot | None]) -> None:
        """Every slot whose round is skipped (:class:`csd.drafters.skip.SkipSchedule`) commits its chain's first
        ``s`` drafts and drafts again after them; its window becomes the anchor, the skipped chain and the new drafts
        (the head forwards of both rounds are counted)."""
        for slot in slots:
            if slot is None:
                continue
            w = slot.draft.window
            s, possible = self._skip_length(slot, w.rows - 1)
            if self.schedule.skip(slot.draft.skip, slot.n, s, possible):
                self._start_skip(slot, w.ids[1 : 1 + s])
        skipped = [0 if slot is None else slot.draft.skipped for slot in slots]
        if not any(skipped):
            return
        first = self.forwards
        rows = [self._chain_rows(slot.n + s) if s else 0 for slot, s in zip(slots, skipped, strict=True)]
        drafted = self._draft(slots, [max(r - 1, 0) for r in rows],
                              [0 if slot is None else slot.n + s for slot, s in zip(slots, skipped, strict=True)])
        self.forwards = [a + b for a, b in zip(first, self.forwards, strict=True)]
        for slot, s, r, (drafts, probs) in zip(slots, skipped, rows, drafted, strict=True):
            if s:
                w = slot.draft.window
                slot.draft.window = ChainWindow(1 + s + r - 1, torch.cat([w.drafts[:s], drafts]),
                                                torch.cat([w.draft_probs[:s], probs]),
                                                torch.cat([w.ids[: 1 + s], self.body(drafts, slot.n + s)]))

    def _tree_skip(self, slot: Slot, w: TreeWindow) -> TreeWindow:
        """A tree round's skip decision; when skipped, one existing candidate path drawn uniformly (the image's
        generator) commits its first ``s`` nodes and a tree is drafted after them: the window is the anchor, the
        skipped chain and that tree (node ``s + v`` the new tree's node ``v``: :func:`static_tree`'s order)."""
        tree = w.tree
        depth = max(tree.depth(v) for v in range(tree.size))
        s, possible = self._skip_length(slot, depth)
        paths: list[list[int]] = []
        if possible:
            valid = w.valid.tolist()
            for leaf in (v for v in range(tree.size) if tree.depth(v) == depth):
                path = [leaf]
                while tree.parent[path[-1]] > 0:
                    path.append(tree.parent[path[-1]])
                if all(valid[v] for v in path):
                    paths.append(path[::-1])
            possible = bool(paths)
        similarity = None
        if possible and self.skip == "similarity":
            at = to_device(paths, self.device)
            similarity = path_similarity(at, self.adapter.embed(w.ids[at]), self.skip_decay)
        if not self.schedule.skip(slot.draft.skip, slot.n, s, possible, similarity):
            return w
        pick = paths[int(torch.randint(len(paths), (1,), generator=slot.generator, device=self.device))]
        nodes = to_device(pick[:s], self.device)
        first = self.forwards
        self._start_skip(slot, w.ids[nodes])
        after = self._tree_window(slot, slot.n + s)
        self.forwards = [first[0] + self.forwards[0]]
        slot.draft.after = after
        widths = (1,) * s + self._widths(slot.n + s)
        shape = self._shape(widths, len(widths))
        one = torch.ones(s, dtype=torch.bool, device=self.device)
        return TreeWindow(shape.tree, shape.mask, shape.grid, shape.grid_of,
                          torch.cat([w.tokens[:1], w.tokens[nodes], after.tokens[1:]]),
                          torch.cat([w.probs[:1], w.probs[nodes], after.probs[1:]]),
                          torch.cat([w.valid[:1], one, after.valid[1:]]),
                          torch.cat([w.forced[:1], w.forced[nodes], after.forced[1:]]),
                          torch.cat([w.ids[:1], w.ids[nodes], after.ids[1:]]))

    def _window(self, slot: Slot) -> ChainWindow | TreeWindow:
        return slot.draft.window

    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """The chain's verification (a static tree: the tree window's RRS, ``verify_tree_window``), plus each image's
        head forwards of this iteration (``drafter_forwards``) and skipped rounds (``skipped``). A window that
        opens with a skipped chain (``skip_verify=false``) commits the chain unjudged and judges the drafts after it
        against the target rows after it (:meth:`_verify_after_skips`)."""
        skipped = [0 if slot is None else slot.draft.skipped for slot in slots]
        if any(skipped) and not self.skip_verify:
            verified = self._verify_after_skips(rule, slots, proposal, target, target_entropy, skipped)
        elif self.tree == "chain":
            verified = super().verify(rule, slots, proposal, target, target_entropy)
        else:
            (slot,), (w,) = slots, proposal.windows
            verified = verify_tree_window(self, rule, slot, w, target[0], target_entropy[0])
        verified.stats[:, FORWARDS] += to_device(self.forwards, self.device)
        if any(skipped):
            verified.stats[:, SKIPPED] += to_device([int(s > 0) for s in skipped], self.device)
        return verified

    def _verify_after_skips(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal,
                            target: torch.Tensor, target_entropy: torch.Tensor, skipped: list[int]) -> Verified:
        """Slot ``b``'s window is its anchor, ``s_b = skipped[b]`` skipped tokens and a window of drafts rooted at the
        last of them: that window is judged alone, on target rows ``s_b ..`` (row ``s_b + j`` predicts body position
        ``n + s_b + j``), and the skipped tokens are committed before its tokens (``COMMIT_ACCEPTED``; the logits of
        rows ``< s_b`` are discarded, as in the released code)."""
        if self.tree != "chain":
            (slot,), (s,) = slots, skipped
            after = slot.draft.after
            v = verify_tree_window(self, rule, replace(slot, n=slot.n + s), after, target[0, s:], target_entropy[0, s:])
            (path,) = v.keep
            w = proposal.windows[0]
            tokens = torch.cat([w.tokens[1 : 1 + s], v.tokens[0]])[None]
            kinds = torch.cat([torch.full((s,), COMMIT_ACCEPTED, dtype=torch.long, device=self.device), v.kinds[0]])[None]
            entropy = torch.cat([target_entropy[0, :s], v.entropy[0]])[None]
            keep = [list(range(s)) + [s + v for v in path]]
            return Verified([s + v.counts[0]], tokens, kinds, entropy, v.stats, keep, v.detail)
        windows = [None if w is None else ChainWindow(w.rows - s, w.drafts[s:], w.draft_probs[s:], w.ids[s:])
                   for w, s in zip(proposal.windows, skipped, strict=True)]
        heads = [None if slot is None else ChainHead(slot.n + s, slot.generator)
                 for slot, s in zip(slots, skipped, strict=True)]
        rows, count = max(w.rows for w in windows if w is not None), len(slots)
        at = (to_device(skipped, self.device)[:, None] + torch.arange(rows, device=self.device)).clamp_max(proposal.rows - 1)
        batch = torch.arange(count, device=self.device)[:, None]
        v = verify_chain_batch(self, rule, heads, windows, target[batch, at], target_entropy[batch, at], [None] * count)
        width = max(skipped) + rows
        tokens = torch.zeros((count, width), dtype=torch.long, device=self.device)
        kinds, entropy = torch.zeros_like(tokens), target_entropy.new_zeros((count, width))
        for b, (w, s) in enumerate(zip(proposal.windows, skipped, strict=True)):
            if w is not None:
                tokens[b, :s], tokens[b, s : s + rows] = w.drafts[:s], v.tokens[b]
                kinds[b, :s], kinds[b, s : s + rows] = COMMIT_ACCEPTED, v.kinds[b]
                entropy[b, :s], entropy[b, s : s + rows] = target_entropy[b, :s], v.entropy[b]
        counts = [m + s if m else 0 for m, s in zip(v.counts, skipped, strict=True)]
        return Verified(counts, tokens, kinds, entropy, v.stats, None, v.detail)

    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """The ``m`` committed tokens join the pending pairs, each with the target feature of the window entry
        before it (the anchor's for the first): ``(x_{n+j}, f_{n+j-1})``, ``j < m``; a tree window's entries are
        its committed path (``verified.keep``). After a skipped chain of ``s`` tokens the head already holds their
        pairs (with reused features, as the released code keeps them): the pairs from ``j = s`` on join; with
        ``skip_verify`` they leave the head and every committed token joins with its own target feature."""
        for b, (slot, w, m) in enumerate(zip(slots, proposal.windows, verified.counts, strict=True)):
            if w is None:
                continue
            state, first = slot.draft, slot.draft.skipped
            if state.skip is not None:
                self._note_skip(b, slot, proposal, verified, m)
                if first and self.skip_verify:
                    r = self.cfg_rows
                    self.cache.rollback([first if row // r == b else 0 for row in range(self.cache.rows)])
                    first = 0
            entries = (slice(first, m) if verified.keep is None else
                       to_device(verified.keep[b][first:], self.device))
            features = proposal.features[b, :, entries]
            state.ids = torch.cat([state.ids, self.body(verified.tokens[b, first:m], slot.n + first)])
            state.features = features if state.features is None else torch.cat([state.features, features], dim=1)

    def _note_skip(self, b: int, slot: Slot, proposal: Proposal, verified: Verified, m: int) -> None:
        """Skipping's bookkeeping: the image's latest target features (those of the committed entries, the last
        ``2 window`` kept) and, for a window with drafts judged, the tokens it committed past a skipped chain
        (``tau``; with ``skip_verify`` only windows without one count)."""
        state, s = slot.draft, slot.draft.skipped
        entries = slice(0, m) if verified.keep is None else to_device(verified.keep[b], self.device)
        recent = proposal.features[b, :, entries]
        state.recent = (recent if state.recent is None else torch.cat([state.recent, recent], dim=1))[:, -2 * self.window :]
        drafted = proposal.windows[b].rows > 1 if self.tree == "chain" else proposal.windows[b].tree.size > 1
        if drafted and not (s and self.skip_verify):
            state.skip.record_verified(m - s)

    def sample_drafts(self, probs: torch.Tensor, slots: list[Slot | None], wanted: list[bool]) -> torch.Tensor:
        """One draft index per slot from its law ``probs [B, V]`` (the recorded ``p``), with the slot's generator."""
        noise = torch.stack([exponential_noise((self.vocab,), slot.generator, self.device) if want
                             else torch.ones(self.vocab, device=self.device) for slot, want in zip(slots, wanted, strict=True)])
        return sample_race(probs, noise)

    def _draft(self, slots: list[Slot | None], gammas: list[int],
               starts: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every slot's ``gammas[b]`` drafts ``[gamma]`` for body positions ``starts[b] ..`` and their recorded laws
        ``[gamma, V]`` (batched head forwards: the pending pairs, then one draft at a time); the head's cache keeps
        the committed pairs only."""
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
                ids = torch.cat([self.body(x[b : b + 1], starts[b] + i) if more[b] else x[b : b + 1]
                                 for b in range(len(slots))])
                embeds = self.adapter.embed(ids.view(-1, 1)).repeat_interleave(r, dim=0)
                feature = self._step(embeds, feature, more)
        self.cache.rollback([max(g - 1, 0) for g in gammas for _ in range(r)])  # the drafts' entries
        drafts, probs = torch.stack(drafts, dim=1), torch.stack(probs, dim=1)
        return [(drafts[b, :g], probs[b, :g]) for b, g in enumerate(gammas)]

    def _ingest(self, slots: list[Slot | None], gammas: list[int]) -> torch.Tensor:
        """One head forward of each drafting slot's pending pairs, row by row (padded to the longest, the padding
        rolled back); returns each cache row's feature ``f'`` for its first draft ``[B * cfg rows, 1, D]``."""
        r, batch = self.cfg_rows, len(slots)
        self._reset_new(slots)
        pending = [pair for slot, g in zip(slots, gammas, strict=True) for pair in (self._pending(slot) if g else [None] * r)]
        counts = [0 if pair is None else pair[0].numel() for pair in pending]
        q, width = max(counts), self.net.config.hidden_size
        ids = torch.zeros((batch * r, q), dtype=torch.long, device=self.device)
        features = torch.zeros((batch * r, q, width), dtype=self.net.fc.weight.dtype, device=self.device)
        for row, (pair, c) in enumerate(zip(pending, counts, strict=True)):
            if c:
                ids[row, :c], features[row, :c] = pair
            else:
                ids[row] = self.body.image_ids[0]
        out = self._forward(self.adapter.embed(ids), features, [c > 0 for c in counts])
        self.cache.rollback([q - c if c else 0 for c in counts])
        last = to_device([max(c - 1, 0) for c in counts], self.device)
        return out[torch.arange(batch * r, device=self.device), last].unsqueeze(1)

    def _pending(self, slot: Slot) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each CFG row's pending pairs, ids ``[c_r]`` and features ``[c_r, D]`` (its prompt pairs, if any, first);
        the state keeps none."""
        state = slot.draft
        rows = [(state.ids, f) for f in state.features]
        if state.prompt is not None:
            rows = [(torch.cat([ids, x]), torch.cat([f, g])) for (ids, f), (x, g) in zip(state.prompt, rows, strict=True)]
        state.ids, state.features, state.prompt = state.ids[:0], state.features[:, :0], None
        return rows

    def _step(self, embeds: torch.Tensor, features: torch.Tensor, advance: list[bool]) -> torch.Tensor:
        """One head forward of ``[B * cfg rows, q, D]`` inputs; the slots flagged in ``advance`` grow their rows."""
        return self._forward(embeds, features, [a for a in advance for _ in range(self.cfg_rows)])

    def _forward(self, embeds: torch.Tensor, features: torch.Tensor, advance: list[bool]) -> torch.Tensor:
        """One head forward of ``[B * cfg rows, q, D]`` inputs; the cache rows flagged in ``advance`` grow."""
        positions, mask = self.cache.extend(slice(0, self.cache.rows), embeds.shape[1], advance)
        return self.net(embeds, features, self.cache, positions, mask)

    def _reset_new(self, slots: list[Slot | None]) -> None:
        """The head's cache for ``len(slots)`` slots; a new image's rows start empty."""
        rows = len(slots) * self.cfg_rows
        drafts = self.window if self.tree == "chain" else static_tree(STATIC_TREES[self.tree], self.window - 1).size
        pairs = max((ids.numel() for slot in slots if slot is not None and slot.draft.prompt is not None
                     for ids, _ in slot.draft.prompt), default=0)
        capacity = pairs + self.adapter.layout.length + 2 * drafts + 16
        if self.cache is None or self.cache.rows != rows:
            decoder = self.adapter.decoder()
            self.cache = RaggedCache(self.net.config, rows, capacity, decoder.dtype, decoder.device)
        self.cache.grow(capacity)  # a longer prompt's pairs than the cache was made for
        for b, slot in enumerate(slots):
            if slot is not None and slot.draft.new:
                self.cache.reset(slice(b * self.cfg_rows, (b + 1) * self.cfg_rows))
                slot.draft.new = False

    def _widths(self, n: int) -> tuple[int, ...]:
        """The static tree's children per depth for a window at ``n`` committed tokens: ``window - 1`` deep at most,
        no draft past the body, no siblings at forced positions; an image's first window and the AR tail are the
        root alone (one AR step)."""
        layout = self.adapter.layout
        span, widths = layout.length - n, STATIC_TREES[self.tree]
        depth = 0 if (span <= layout.jacobi_tail or n == 0) else min(self.window, span) - 1
        return tuple(1 if self.body.forced_host[n - 1 + d] or d > len(widths) else widths[d - 1]
                     for d in range(1, depth + 1))

    def _shape(self, widths: tuple[int, ...], depth: int) -> HeadTree:
        """The window shape of a static tree with ``widths`` per depth, ``depth`` deep (built once)."""
        if (widths, depth) not in self._shapes:
            self._shapes[widths, depth] = HeadTree.build(widths, depth, self.device)
        return self._shapes[widths, depth]

    def _tree_window(self, slot: Slot, n: int) -> TreeWindow:
        """A static tree window (``tree``, :meth:`_widths`) whose root is the token at ``n - 1`` (``slot.n``, or the
        end of a skipped chain); its anchor id is the slot's (the skipped chain's root)."""
        widths = self._widths(n)
        shape = self._shape(widths, len(widths))
        tokens, probs, valid = self._tree_draft(slot, shape, n)
        positions = (n - 1 + shape.mask.depth).clamp_min(0)
        forced = self.body.is_forced[positions] & (shape.mask.depth > 0)
        ids = torch.where(forced, self.body.forced[positions], self.body.image_ids[tokens])
        ids = torch.cat([self.anchor(slot), ids[1:]])
        return TreeWindow(shape.tree, shape.mask, shape.grid, shape.grid_of, tokens, probs, valid, forced, ids)

    def _tree_draft(self, slot: Slot, shape: HeadTree, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every node's candidate, recorded law and existence (the root: none). Level by level, each parent's law
        ``p = Q(H(f'))`` and its children drawn one after the other from ``p`` without the earlier ones (exponential
        races, the image's generator), each recorded with ``p``; then one head forward of the new level's nodes (each
        seeing the committed pairs and its ancestors' entries), whose ``f'`` give the next level's laws. Head forwards:
        the ingest plus one per level but the last; the draft entries leave the head's cache afterwards."""
        size, depth, r = shape.tree.size, len(shape.levels) - 1, self.cfg_rows
        tokens = torch.zeros(size, dtype=torch.long, device=self.device)
        probs = torch.zeros((size, self.vocab), dtype=torch.float32, device=self.device)
        valid = torch.zeros(size, dtype=torch.bool, device=self.device)
        self.forwards = [depth]
        if depth == 0:
            return tokens, probs, valid
        feature = self._ingest([slot], [depth])  # [cfg rows, 1, D]: the root's f'
        start, entries = self.cache.lengths.clone(), 0
        for d in range(1, depth + 1):
            parents, kids = shape.levels[d - 1], shape.levels[d]
            width = len(kids) // len(parents)
            law = self.pipeline(self.adapter.head(feature).view(1, r, len(parents), -1))[0]
            drawn, exists = self.draw_children(law, width, slot.generator)
            at = to_device(kids, self.device)
            tokens[at], valid[at], probs[at] = drawn.flatten(), exists.flatten(), law.repeat_interleave(width, dim=0)
            if d < depth:
                pos = n + d - 1
                ids = torch.where(self.body.is_forced[pos], self.body.forced[pos], self.body.image_ids[drawn.flatten()])
                embeds = self.adapter.embed(ids.view(1, -1)).repeat_interleave(r, dim=0)
                feature = self._tree_step(embeds, feature.repeat_interleave(width, dim=1), start, shape.head, entries)
                entries += len(kids)
        self.cache.rollback([entries] * self.cache.rows)
        return tokens, probs, valid

    def draw_children(self, law: torch.Tensor, width: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``width`` children ``[m, width]`` of each of ``m`` parents, one after the other from the parent's law ``[m, V]``
        without the earlier ones (exponential races), and whether each exists (a law with fewer codes has none)."""
        noise = exponential_noise((law.shape[0], width, self.vocab), gen, self.device)
        return without_replacement(law, noise, torch.zeros(law.shape, dtype=torch.bool, device=self.device))

    def _tree_step(self, embeds: torch.Tensor, features: torch.Tensor, start: torch.Tensor, head: TreeMask,
                   first: int) -> torch.Tensor:
        """One head forward of a level's ``q`` nodes ``[cfg rows, q, D]``, the head's draft entries ``first ..
        first + q - 1``: a node at depth ``d`` has position ``start + d - 1`` (``start``: the cache length before
        the drafts) and sees the committed pairs, its ancestors' entries and its own."""
        q = embeds.shape[1]
        _, causal = self.cache.extend(slice(0, self.cache.rows), q)
        seen = TreeMask(head.depth[: first + q], head.ancestors[: first + q, : first + q])
        visible = seen.visible(start, causal.shape[-1])[:, first:]
        mask = torch.zeros(visible.shape, dtype=causal.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(causal.dtype).min)
        positions = start[:, None] + head.depth[first : first + q] - 1
        return self.net(embeds, features, self.cache, positions, mask.unsqueeze(1))
