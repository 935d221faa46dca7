"""Vectorised verification of one Jacobi window (docs/ALGORITHMS.md, "The engine loop", steps 4-5) and host-sync-free sampling.

Everything here is tensors in, tensors out, batched over a leading dimension ``B``, with no
``.item()`` and no ``torch.multinomial``: categorical samples use the exponential race
``argmax_v q(v) / E_v`` with ``E_v ~ Exp(1)`` (equivalent to Gumbel-max), so the same code is safe
inside a captured CUDA graph once the noise is drawn outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csd.acceptance import AcceptanceRule, likelihood_ratio, lossless_residual


def exponential_noise(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``E ~ Exp(1)`` i.i.d. as ``-log(1 - U)``, strictly positive.

    ``torch.rand`` gives ``U`` in ``[0, 1)`` on a grid of ``2^-24``; ``U = 0`` would give ``E = 0``,
    so the lowest grid cell is mapped to the smallest positive float instead (a point of the same
    cell ``[0, 2^-24)`` that ``E`` stands for).
    """
    u = torch.rand(shape, generator=generator, device=device)
    return u.neg_().log1p_().neg_().clamp_min_(torch.finfo(u.dtype).tiny)  # -log1p(-u) in place: one buffer


def sample_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One categorical sample per row of ``probs [..., V]`` given ``noise ~ Exp(1)`` of the same shape.

    ``argmax_v q(v) / E_v`` over the support only: a zero-probability entry scores ``-inf``, so it can
    never win, whatever its noise (``0 / 0`` would be NaN, which ``argmax`` picks). Every row must have
    mass: a row without any (all zero, or NaN) has no sample, and ``argmax`` would return code 0 whatever
    its probability, so it is an error (``RuntimeError``; checked on the device, no host synchronisation).
    Rules whose formula can leave no mass use a fallback law (:class:`csd.acceptance.Residual`).
    """
    best, token = torch.max(torch.where(probs > 0, probs / noise, float("-inf")), dim=-1)
    torch._assert_async((best > float("-inf")).all(), "sample_race: a law with no mass (all zero or NaN) cannot be sampled")
    return token


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return sample_race(probs, exponential_noise(tuple(probs.shape), generator, probs.device))


@dataclass
class WindowNoise:
    """The random numbers one window's verification consumes, for ``B`` windows of ``K`` rows.

    ``samples [B, K, V]`` (``Exp(1)``, the row samples' race), ``uniforms [B, K - 1]`` (one per draft),
    ``residual [B, V]`` (``Exp(1)``, the replacement's race). The engine draws each window's share from
    that image's own generator (:meth:`draw` with ``B = 1``), so an image never depends on its neighbours.
    """

    samples: torch.Tensor
    uniforms: torch.Tensor
    residual: torch.Tensor

    @classmethod
    def draw(
        cls, batch: int, window: int, vocab: int, generator: torch.Generator, device: torch.device,
        samples: torch.Tensor | None = None,
    ) -> WindowNoise:
        """Draw in a fixed order: row samples (unless ``samples`` is given: Gumbel sharing), uniforms, residual."""
        if samples is None:
            samples = exponential_noise((batch, window, vocab), generator, device)
        uniforms = torch.rand((batch, window - 1), generator=generator, device=device)
        return cls(samples, uniforms, exponential_noise((batch, vocab), generator, device))


@dataclass
class WindowResult:
    """Outcome of verifying a batch of windows of ``K`` rows (``K - 1`` drafts).

    ``n_accepted [B]``: drafts accepted before the first rejection (the row's draft count if none), so the
    window commits ``n_accepted + 1`` tokens: ``committed[:, :n_accepted + 1]``.
    ``accepted``, ``relaxed``, ``verified``, ``filter_pass``: per-draft flags ``[B, K - 1]``
    (``relaxed``: accepted although ``min(1, q/p)`` would have rejected with the same uniform).
    ``fallback [B]``: the replacement was drawn from the rule's fallback law (its residual had no mass).
    """

    n_accepted: torch.Tensor
    committed: torch.Tensor
    accepted: torch.Tensor
    relaxed: torch.Tensor
    verified: torch.Tensor
    filter_pass: torch.Tensor | None
    fallback: torch.Tensor


def verify_window(
    rule: AcceptanceRule,
    target_probs: torch.Tensor,
    target_entropy: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_forced: torch.Tensor | None,
    noise: WindowNoise | torch.Generator,
    n_drafts: torch.Tensor | None = None,
) -> tuple[WindowResult, torch.Tensor]:
    """Verify drafts left to right and pick the replacement/bonus token.

    Shapes: ``target_probs [B, K, V]`` (row ``j`` is the target for the token after window element
    ``j``), ``target_entropy [B, K]``, ``drafts [B, K-1]`` (window elements ``1..K-1``, image-code
    indices), ``draft_probs [B, K-1, V]`` (the recorded ``p``), ``draft_forced [B, K-1]`` (forced
    structural tokens: always accepted, never counted; None: none is forced). ``n_drafts [B]``: drafts of each window (ragged
    batches; default ``K - 1``); later entries are padding and never committed.

    Draft ``i`` (window element ``i``) is judged against ``q_{i-1}``. At the first rejection ``i*`` the
    replacement is drawn from ``rule.residual(q_{i*-1}, p_{i*})``; if every draft of a window is accepted
    the free sample ``y_{n_drafts} ~ q_{n_drafts}`` is the bonus. Returns the result and the fresh samples
    ``y [B, K]`` of every row (the engine refreshes its drafts from them, SJD step 6).

    ``noise``: the window's random numbers (:class:`WindowNoise`), or a generator to draw them from in
    their fixed order (so rules with identical ``b`` give identical tokens under the same seed).
    """
    batch, window, vocab = target_probs.shape
    device = target_probs.device
    if isinstance(noise, torch.Generator):
        noise = WindowNoise.draw(batch, window, vocab, noise, device)
    samples = sample_race(target_probs, noise.samples)
    if window == 1:
        empty = torch.zeros((batch, 0), dtype=torch.bool, device=device)
        zero = torch.zeros(batch, dtype=torch.long, device=device)
        return WindowResult(zero, samples, empty, empty, empty, None, zero.bool()), samples

    positions = torch.arange(window - 1, device=device)
    valid = None if n_drafts is None else positions < n_drafts.unsqueeze(-1)
    verdict = rule.accept_prob(target_probs[:, :-1], draft_probs, drafts, target_entropy[:, :-1])
    accept_prob = verdict.accept_prob if draft_forced is None else torch.where(draft_forced, 1.0, verdict.accept_prob)
    accepted_raw = noise.uniforms < accept_prob
    if valid is not None:
        accepted_raw &= valid
    # the leading run of accepted drafts (padding counts as rejected): n_accepted is the index of the first
    # rejection, or K - 1 when every draft is accepted
    leading = accepted_raw.cumprod(-1)
    n_accepted = leading.sum(-1)
    accepted = leading.bool()
    verified = positions <= n_accepted.unsqueeze(-1)
    if valid is not None:
        verified &= valid

    rejected_one = n_accepted < (window - 1 if n_drafts is None else n_drafts)
    last, fallback = _last_token(rule, target_probs, draft_probs, drafts, samples, n_accepted, rejected_one, noise)
    committed = torch.cat([drafts, samples[:, -1:]], dim=1)
    committed = committed.scatter(1, n_accepted.unsqueeze(-1), last.unsqueeze(-1))

    if draft_forced is not None:  # forced drafts are accepted but never counted
        free = ~draft_forced
        accepted, verified = accepted & free, verified & free
    relaxed = accepted & (noise.uniforms >= verdict.lossless_prob)
    filter_pass = None if verdict.filter_pass is None else verdict.filter_pass & verified
    result = WindowResult(n_accepted, committed, accepted, relaxed, verified, filter_pass, fallback)
    return result, samples


def _last_token(rule: AcceptanceRule, target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor,
                samples: torch.Tensor, n_accepted: torch.Tensor, rejected_one: torch.Tensor,
                noise: WindowNoise) -> tuple[torch.Tensor, torch.Tensor]:
    """The window's last committed token ``[B]``: the replacement from the rule's residual at the first rejection,
    else the bonus row sample; and whether the replacement came from the rule's fallback law. The residual is
    computed at a clamped index where nothing was rejected (and unused there)."""
    rows = torch.arange(target_probs.shape[0], device=target_probs.device)
    rej = n_accepted.clamp(max=target_probs.shape[1] - 2)
    residual = rule.residual(target_probs[rows, rej], draft_probs[rows, rej], drafts[rows, rej])
    replacement = sample_race(residual.probs, noise.residual)
    return torch.where(rejected_one, replacement, samples[rows, n_accepted]), rejected_one & residual.fallback


def couple_drafts(
    target_probs: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Maximal coupling of each old draft with its new target (MC-SJD's refresh, docs/ALGORITHMS.md "Drafting variants").

    Keep ``x`` with probability ``min(1, q(x)/p(x))``, else draw from ``norm([q - p]_+)``: the result is
    distributed as ``q`` and equals the old draft as often as possible. Shapes ``[..., V]`` / ``[...]``.
    """
    keep = torch.rand(drafts.shape, generator=generator, device=drafts.device) < likelihood_ratio(
        target_probs, draft_probs, drafts
    )
    noise = exponential_noise(tuple(target_probs.shape), generator, target_probs.device)
    return torch.where(keep, drafts, sample_race(lossless_residual(target_probs, draft_probs), noise))
