"""The drafter axis of the engine: what a drafter proposes, what the engine gives back to it.

A drafter owns everything about the window of an iteration (docs/ALGORITHMS.md, "The engine loop"):

1. :meth:`Drafter.propose` builds every slot's window: model input ids (column 0 the anchor, the last committed
   token), the drafts and the law each was drawn from (the recorded ``p``), and the attention structure (a chain,
   or a tree mask);
4. :meth:`Drafter.verify` judges the drafts with the acceptance rule against the targets ``q`` of the forward and
   reads, in the iteration's one host synchronisation, what each slot commits;
5. :meth:`Drafter.refresh` turns this forward's targets into the next window's carried drafts.

The engine does the rest (2 forward, 3 target, 6 roll back the cache, 7 commit, slot refill). Every random number
of an image comes from its own generator in a fixed order, so its tokens never depend on its batch neighbours.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from csd.acceptance import AcceptanceRule
from csd.adapters.base import ModelAdapter
from csd.keys import COUPLINGS, DRAFT_RECORDS, INIT_SCHEMES
from csd.params import Param, Parametrized
from csd.schema import Choice, Int
from csd.verify import exponential_noise

if TYPE_CHECKING:
    from csd.slot import Slot
    from csd.tree import TreeMask

#: per-image counters every drafter reports, in this order (records, docs/ALGORITHMS.md "What is recorded");
#: ``drafter_forwards``: forwards of the drafter's own model (0 for drafters without one: chain, pac_tree);
#: ``skipped``: drafting rounds committed without a target forward of their own (``drafter.skip``, VVS; else 0)
STAT_KEYS = ("drafts_proposed", "drafts_verified", "drafts_accepted", "relaxed_accepts", "filter_checks", "filter_passes",
             "residual_fallbacks", "drafter_forwards", "skipped")
#: the column of ``drafter_forwards`` in a verified iteration's ``stats``
FORWARDS = STAT_KEYS.index("drafter_forwards")


class BodyIds:
    """The body layout as device tensors: image-code index -> adapter token id, forced structural positions."""

    def __init__(self, adapter: ModelAdapter) -> None:
        layout, device = adapter.layout, adapter.device
        self.forced = layout.forced_ids.to(device)
        self.is_forced = self.forced >= 0
        self.forced_host = (layout.forced_ids >= 0).tolist()
        self.cols = layout.cols.tolist()
        self.image_ids = adapter.image_token_ids.to(device)
        #: some body position is forced (a layout without any, of one id dtype, needs no per-call selection)
        self.any_forced = any(self.forced_host) or self.image_ids.dtype != self.forced.dtype

    def __call__(self, idx: torch.Tensor, start: int) -> torch.Tensor:
        """Image-code indices at body positions ``start ..`` -> adapter token ids (forced ids where forced)."""
        if not self.any_forced:
            return self.image_ids[idx]
        end = start + idx.numel()
        return torch.where(self.is_forced[start:end], self.forced[start:end], self.image_ids[idx])


@dataclass
class Proposal:
    """Every slot's window of one iteration, padded to one shape: ``ids [B, fed]`` (column 0 the anchor; an empty
    slot's row is any token), ``from_prompt [B]`` (the anchor is the prompt's last token), ``active [B]``, ``rows``
    target rows to read, ``tree`` (tree windows: the attention structure) and the drafter's own per-slot data.
    ``features``: the target's last hidden states of the window ``[B, cfg rows, fed, D]``, which the engine fills in
    after the forward for a drafter that reads them (:attr:`Drafter.reads_features`), else None. ``shift [B, fed]``:
    position ids other than the cache order (entry ``j`` of a slot whose cache holds ``e`` entries has position id
    ``e + j + shift[b, j]`` and sees the entries written so far whose position id is at most its own:
    ``csd.cache.RaggedCache.extend``; ZipAR, PJD), None: position id = cache order, causal. ``groups [B, fed]`` (with
    ``shift``; PJD's row-causal windows): inside the window an entry sees only group-0 entries and its own group's.
    ``noise [B, 1, V]``: one-row windows' ``Exp(1)`` noise, drawn at the proposal on the compiled path so that the
    step's graph samples them (``csd.fast.step_and_target``), and ``samples [B, 1]`` what it sampled (set by the
    engine after the forward; None where the step did not sample, e.g. an empty prompt's first window)."""

    ids: torch.Tensor
    from_prompt: list[bool]
    active: list[bool]
    rows: int
    tree: TreeMask | None
    windows: list[Any]
    features: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    groups: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    samples: torch.Tensor | None = None

    @property
    def fed(self) -> int:
        return self.ids.shape[1]


@dataclass
class Verified:
    """What each slot commits: ``counts [B]`` (host ints, 0 for an empty slot), ``tokens``, ``kinds`` (COMMIT_*),
    ``entropy`` ``[B, R]`` (the first ``counts[b]`` of row ``b`` are committed), ``stats [B, len(STAT_KEYS)]``;
    ``keep`` (tree windows: the window entries each slot keeps in the cache; None: the first ``counts[b]``), and
    the drafter's own results for :meth:`Drafter.refresh`."""

    counts: list[int]
    tokens: torch.Tensor
    kinds: torch.Tensor
    entropy: torch.Tensor
    stats: torch.Tensor
    keep: list[list[int]] | None
    detail: Any


class Drafter(Parametrized, ABC):
    """A drafting scheme (docs/ALGORITHMS.md, "Drafters"): proposes windows, verifies them with any rule, refreshes
    its drafts. It declares its hyper-parameters in ``PARAMS`` (``csd.params``; ``drafter.<key>`` in the config):
    ``window`` = ``L``, the entries one forward spends per image (anchor included; None for a drafter without windows:
    ZipAR's forwards have one entry per image row in flight); ``init`` (fresh drafts),
    ``draft_record`` (their recorded law) and ``coupling`` (the refresh), shared by the chain and the tree drafters."""

    name: str
    group = "drafter"
    #: the engine hands the target's hidden states of each window to :meth:`refresh` (``Proposal.features``)
    reads_features = False
    #: the chain verification's tensor work compiled under engine.compile (``ChainDrafter.compile_post``); None: eager
    compiled_judge: Callable[..., Any] | None = None
    PARAMS = {
        "window": Param(Int(min=1), 16, "L: the last committed token + L - 1 drafts (1 = AR)"),
        "init": Param(Choice(options=INIT_SCHEMES), "random", "fresh drafts: random codes, or copies of the left neighbour"),
        "coupling": Param(Choice(options=COUPLINGS), "none",
                          "refreshed drafts: fresh samples (none), old drafts maximally coupled (maximal), or one Gumbel "
                          "noise per position (gumbel)"),
        "draft_record": Param(Choice(options=DRAFT_RECORDS), "onehot",
                              "the recorded p of fresh random drafts: one-hot, or the uniform law they are drawn from"),
    }

    def check_params(self) -> None:
        if self.draft_record == "uniform" and self.init != "random":
            raise ValueError("drafter.draft_record=uniform records the law of init=random drafts; repeat_left drafts "
                             "are not drawn from it")

    def params(self) -> dict[str, object]:
        """The drafting settings recorded with every image (``method_params``, before the rule's): the drafter's name
        (so a run directory refuses another drafter's images) and its parameters. ``chain`` and ``pac_tree`` runs
        were recorded without a name before the drafter group (the tree keys tell them apart) and still are."""
        values = self.param_values()
        return values if self.name in ("chain", "pac_tree") else {"drafter": self.name, **values}

    def problem(self, batch_size: int, compiled: bool) -> str | None:
        """Why this drafter cannot decode ``batch_size`` images at once (compiled or not), in one line; None if it can."""
        return None

    def method_problem(self, method: str) -> str | None:
        """Why this drafter cannot run with ``method=<method>`` (an acceptance rule), in one line; None if it can.
        Drafting windows: ``method=ar`` is a chain of ``window = 1`` and any other rule needs drafts to judge."""
        window = self.window
        if method == "ar" and "window" not in self.PARAMS:
            return f"method=ar decodes one token per forward, but drafter={self.name} always drafts: use drafter=chain (the default)"
        if method == "ar" and window != 1:
            return f"method=ar needs drafter.window=1, got {window}"
        if method != "ar" and window <= 1:
            return (f"method={method} with drafter.window=1 decodes exactly like method=ar (one token per forward, no "
                    "drafts) but would be labelled and reported as another method: use method=ar, or drafter.window >= 2")
        return None

    def window_problem(self, body_len: int, model: str) -> str | None:
        """Why this drafter's windows are longer than an image of ``body_len`` tokens (of ``model=<model>``), in one
        line naming the setting as typed; None if they are not. A window holds at most the tokens left to decode, so a
        longer one decodes as one of the image's length (:meth:`window_fix` says how to set that)."""
        if self.window is None or self.window <= body_len:
            return None
        return f"drafter.window={self.window} is longer than model={model}'s image ({body_len} tokens)"

    def window_fix(self, body_len: int) -> str:
        """The setting that makes windows fit an image of ``body_len`` tokens."""
        return f"set drafter.window <= {body_len}"

    def forward_entries(self, grid: tuple[int, int], body_len: int) -> int:
        """The most entries one forward feeds per image on a ``grid`` of ``body_len`` body positions (the memory
        plan's window): ``window``, or the body for a drafter without windows (ZipAR: one entry per row in flight)."""
        return body_len if self.window is None else self.window

    def model_problem(self, adapter_class: type[ModelAdapter]) -> str | None:
        """Why this drafter cannot draft for the models of ``adapter_class``, in one line (checked with the config,
        before any weight loads); None if it can."""
        return None

    def refuse_model(self, adapter: ModelAdapter) -> None:
        """Raise :meth:`model_problem`'s line for ``adapter``'s class, if any (drafters that need more than logits call
        it in :meth:`bind`)."""
        problem = self.model_problem(type(adapter))
        if problem is not None:
            raise ValueError(problem)

    def bind(self, adapter: ModelAdapter, body: BodyIds, pad: bool) -> None:
        """Attach to the adapter the engine decodes with; ``pad``: every multi-token window is padded to ``window``
        rows (the compiled path's two step shapes)."""
        self.adapter, self.body, self.pad = adapter, body, pad
        self.device, self.vocab = adapter.device, adapter.vocab_size

    def compile_post(self, compile: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Under ``engine.compile``: ``compile`` (``csd.fast.CompiledStep.compile``) the verification's tensor work,
        called at the step's fixed shapes. Only the chain drafter runs compiled (the others refuse in :meth:`problem`),
        so by default there is nothing to compile."""

    def start(self, slot: Slot) -> None:
        """A new image in ``slot``: its drafter state (``slot.draft``). Gumbel sharing draws one ``Exp(1)`` vector per
        body position now, before any other random number of the image."""
        slot.draft = self.new_state(
            slot, None if self.coupling != "gumbel" else
            exponential_noise((self.adapter.layout.length, self.vocab), slot.generator, self.device))

    def finish(self, slot: Slot) -> None:
        """The image in ``slot`` is complete: put its body and per-position records (``commit_iter``, ``commit_kind``,
        ``entropy``) in raster order. Drafters that commit in raster order (all but ZipAR) have nothing to do."""

    @abstractmethod
    def new_state(self, slot: Slot, shared: torch.Tensor | None) -> Any:
        """The drafter's state of a new image (``shared``: its Gumbel-sharing noise or None)."""

    @abstractmethod
    def propose(self, slots: list[Slot | None]) -> Proposal:
        """Step 1: every slot's next window."""

    @abstractmethod
    def verify(self, rule: AcceptanceRule, slots: list[Slot | None], proposal: Proposal, target: torch.Tensor,
               target_entropy: torch.Tensor) -> Verified:
        """Step 4: judge the drafts against ``target [B, rows, V]`` (``target_entropy [B, rows]``) with ``rule``; one
        host synchronisation."""

    @abstractmethod
    def refresh(self, slots: list[Slot | None], proposal: Proposal, verified: Verified, target: torch.Tensor) -> None:
        """Step 5: the next window's carried drafts of every slot, from this forward."""

    def fresh_drafts(self, start: int, count: int, left: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
        """``count`` fresh draft indices for positions ``start ..``; ``left`` is the index at ``start - 1``."""
        rand = torch.randint(self.vocab, (count,), generator=gen, device=self.device)
        if self.init == "random" or count == 0:
            return rand
        # repeat_left: copy the left neighbour in the same image row (random at a row start)
        out = []
        for j in range(count):
            left = rand[j] if (self.body.cols[start + j] <= 0 or left is None) else left
            out.append(left)
        return torch.stack(out)

    def fresh_probs(self, fresh: torch.Tensor) -> torch.Tensor:
        """The recorded ``p`` of fresh drafts ``[count]``: one-hot rows, or the uniform law over the image codes (a
        fresh random draft's real law: as lossless, and SJD accepts it with ``min(1, V q(x))`` instead of ``q(x)``)."""
        if self.draft_record == "uniform":
            return torch.full((fresh.numel(), self.vocab), 1.0 / self.vocab, device=self.device)
        return F.one_hot(fresh, self.vocab).float()

    def anchor(self, slot: Slot) -> torch.Tensor:
        """The window's anchor id ``[1]``: the last committed token (the adapter puts the prompt's last token there
        when nothing is committed yet)."""
        n = slot.n
        return self.body(slot.body[n - 1 : n], n - 1) if n else self.body.image_ids[:1]

    def spine(self, slot: Slot, carried: torch.Tensor, carried_probs: torch.Tensor,
              n_drafts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """SJD step 1 for a chain of ``n_drafts`` drafts: the carried drafts topped up with fresh ones. Returns the
        drafts, their recorded laws and the anchor's id (the last committed token; the adapter puts the prompt's
        last token there when nothing is committed yet)."""
        n, anchor = slot.n, self.anchor(slot)
        keep = min(carried.numel(), n_drafts)
        if keep == n_drafts:  # no fresh draft (an AR step, or enough carried ones): no random number is drawn
            return carried[:keep], carried_probs[:keep], anchor
        left = carried[keep - 1] if keep else (slot.body[n - 1] if n else None)
        fresh = self.fresh_drafts(n + keep, n_drafts - keep, left, slot.generator)
        drafts = torch.cat([carried[:keep], fresh])
        probs = torch.cat([carried_probs[:keep], self.fresh_probs(fresh)])
        return drafts, probs, anchor


def features_problem(drafter: str, adapter_class: type[ModelAdapter]) -> str | None:
    """``drafter=<drafter>`` needs the target's hidden states (EAGLE, SSD and Hawk heads read them): one line if
    ``adapter_class`` does not expose them, else None."""
    if adapter_class.exposes_features():
        return None
    return (f"drafter={drafter} reads the target's hidden states, which {adapter_class.__name__} does not expose "
            "(features_step / head / embed)")
