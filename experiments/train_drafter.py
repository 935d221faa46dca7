"""Train an EAGLE draft head (``drafter=eagle``) or SSD's spatial heads (``--kind spatial``, ``drafter=ssd``) for a
target model: docs/DRAFT_HEADS.md, "Training a head" and "SSD spatial heads".

Usage, from the repository root (run-config overrides choose the model preset and the prompts; the last
``--val-prompts`` prompts are held out for validation)::

    HF_HUB_OFFLINE=1 python -m experiments.train_drafter model=toy dataset=toy dataset.split=train \\
        dataset.n_prompts=136 --out csd/toy/assets/eagle_head.pt

1. collect: AR samples of the target on the training prompts (the engine, ``method=ar``), then one no-cache forward
   per sample for the target's last hidden states of every position (``csd.ragged.reference_features``; each CFG
   row is one training sequence). Sample ``s`` of the prompt at dataset index ``i`` decodes with the seed ``run.py``
   gives that image, ``csd.pipeline.image_seed(seed, i, s)``: every sample has its own seed, and the held-out
   prompts (later indices) get seeds no training sample has. Cached in the checkpoint directory with those seeds.
2. train: EAGLE's losses (docs/DRAFT_HEADS.md): smooth L1 between the head's predicted and the target's next feature,
   plus ``--token-weight`` times the cross-entropy of the head's distribution (the target's own output head over the
   predicted feature) against the target's distribution; uniform noise on the input features. Resumable: the
   checkpoint (``--checkpoint``, saved every ``--save-every`` steps and on Ctrl-C) holds the step, the head and the
   optimiser, and each step's batch and noise come from a generator seeded with (seed, step), so a resumed run is the
   uninterrupted one.
3. validate: ``method=sjd drafter=eagle`` on the held-out prompts (their ``image_seed(seed, i, 0)``); the mean accepted
   length is the tokens committed per target forward (step compression), before and after training.

Heads trained before the per-sample seeds (the shipped toy head until results/toy_drafters/eagle_data_curve.md)
decoded every training sample and every validation image with ``seed + s`` (seed 0 for one sample per prompt); the
command line is unchanged, and a checkpoint directory whose cached samples lack the new seeds is refused.

``--kind spatial`` (SSD, arXiv 2606.20543; ``csd.drafters.spatial_heads``): the same samples (every sample drawn with
its own seed), then each of the ``k_h + k_v`` heads regresses, with SmoothL1, the target's feature at its offset from
every cell's (feature, token) pair (horizontal heads within the row); validation decodes the held-out prompts with
``drafter=ssd`` at ``r = 0`` and ``r = 1`` and reports the first round's acceptance rate and the step compression,
before and after training::

    HF_HUB_OFFLINE=1 python -m experiments.train_drafter --kind spatial model=toy dataset=toy dataset.split=train \\
        dataset.n_prompts=136 --samples-per-prompt 4 --k-h 5 --k-v 2 --ffn 128 --out csd/toy/assets/spatial_heads.pt
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from tqdm import tqdm

from csd.acceptance import SJD
from csd.adapters.base import ModelAdapter
from csd.compose import build_adapter, load_prompts
from csd.device import resolve_device
from csd.drafters.chain import ChainDrafter
from csd.drafters.eagle import EagleDrafter, EagleHead, head_config, load_head, save_head
from csd.drafters.spatial import RowGrid
from csd.drafters.spatial_heads import SpatialHeads, load_spatial_heads, save_spatial_heads
from csd.drafters.ssd import SSDDrafter
from csd.engine import JacobiEngine
from csd.limits import samples_problem
from csd.pipeline import image_seed
from csd.presets import CONF_DIR
from csd.prompts import Prompt
from csd.ragged import reference_features
from csd.slot import Request
from csd.validate import validate

#: a training step's loss of ``(ids, features, noise)`` and its logged values
LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m experiments.train_drafter",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="run-config overrides: model=..., dataset=..., dataset.n_prompts=...")
    parser.add_argument("--kind", choices=("eagle", "spatial"), default="eagle",
                        help="eagle: an EAGLE head (drafter=eagle); spatial: SSD's spatial heads (drafter=ssd)")
    parser.add_argument("--out", type=Path, required=True, help="the trained head's file")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory (default: <out>.ckpt)")
    parser.add_argument("--samples-per-prompt", type=int, default=1, help="AR samples of each training prompt")
    parser.add_argument("--val-prompts", type=int, default=8, help="the dataset's last prompts, held out")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16, help="sequences (CFG rows of samples) per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--token-weight", type=float, default=0.1, help="EAGLE's p_w: weight of the token loss")
    parser.add_argument("--noise", type=float, default=0.2, help="width of the uniform noise on input features")
    parser.add_argument("--window", type=int, default=5, help="drafter.window of the validation decode")
    parser.add_argument("--save-every", type=int, default=200)
    parser.add_argument("--decode-batch", type=int, default=16, help="images in flight when sampling / validating")
    parser.add_argument("--k-h", type=int, default=5, help="--kind spatial: horizontal heads (+1 .. +k_h)")
    parser.add_argument("--k-v", type=int, default=2, help="--kind spatial: vertical heads (+W .. +k_v W)")
    parser.add_argument("--ffn", type=int, default=None, help="--kind spatial: SwiGLU width (default: the hidden size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    for key in ("samples_per_prompt", "val_prompts", "steps", "batch", "window", "save_every", "decode_batch"):
        if getattr(args, key) < (2 if key == "window" else 1):
            parser.error(f"--{key.replace('_', '-')}={getattr(args, key)} must be >= {2 if key == 'window' else 1}")
    return args, args.overrides


def run_config(overrides: list[str]) -> DictConfig:
    """The run config of ``overrides`` (validated, as ``run.py`` would)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["method=ar", "drafter.window=1", *overrides])
    validate(cfg)
    return cfg


def sample_seeds(seed: int, first_index: int, n_prompts: int, samples: int) -> list[int]:
    """The seeds of ``samples`` images of each of ``n_prompts`` prompts from dataset index ``first_index``, prompt-major:
    ``csd.pipeline.image_seed(seed, index, sample)``, the seeds ``run.py`` decodes those images with (distinct for
    ``samples <= csd.limits.PROMPT_STRIDE``)."""
    return [image_seed(seed, first_index + i, s) for i in range(n_prompts) for s in range(samples)]


@torch.no_grad()
def collect(adapter: ModelAdapter, prompts: list[Prompt], samples: int, seed: int, batch: int) -> dict[str, torch.Tensor]:
    """AR samples of ``prompts`` (dataset indices ``0 ..``, seeds :func:`sample_seeds`): body ids ``[S, N]``, the
    target's features ``[S, rows, N + 1, D]`` (column 0 the prompt's last token's, column ``j`` the body token
    ``j - 1``'s) and the seeds ``[S]``."""
    engine = JacobiEngine(adapter, SJD(), ChainDrafter(window=1), batch_size=batch)
    seeds = sample_seeds(seed, 0, len(prompts), samples)
    requests = [Request(prompts[k // samples].text, s, key=k) for k, s in enumerate(seeds)]
    ids, features = [None] * len(requests), [None] * len(requests)
    for request, gen in tqdm(engine.generate_many(requests), total=len(requests), desc="AR samples"):
        ids[request.key] = gen.tokens.to(adapter.device)
        features[request.key] = reference_features(adapter, request.prompt, ids[request.key]).cpu()
    return {"ids": torch.stack(ids).cpu(), "features": torch.stack(features), "seeds": torch.tensor(seeds)}


def load_samples(data_file: Path, seeds: list[int]) -> dict[str, torch.Tensor]:
    """The cached samples in ``data_file``, refused in one line unless they were decoded with ``seeds`` (a cache of
    another run, or of the code before per-sample seeds, would train on other images)."""
    data = torch.load(data_file, weights_only=True)
    if "seeds" not in data or data["seeds"].tolist() != seeds:
        raise SystemExit(f"{data_file} holds AR samples of other seeds than this run's (another --seed, "
                         "--samples-per-prompt or prompt list, or a cache from before per-sample seeds): delete it")
    return data


def image_logits(adapter: ModelAdapter, features: torch.Tensor) -> torch.Tensor:
    """The target's output head over ``features`` (cast to the target's dtype), restricted to the image codes (fp32)."""
    logits = adapter.head(features.to(adapter.decoder().dtype)).float()
    return logits if adapter.raw_image_columns is None else logits[..., adapter.raw_image_columns.to(logits.device)]


def losses(net: EagleHead, adapter: ModelAdapter, ids: torch.Tensor, features: torch.Tensor, noise: torch.Tensor,
           token_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE's loss on sequences ``ids [B, N]``, ``features [B, N + 1, D]``: pairs ``(x_j, f_{j-1} + noise)`` predict
    ``f_j``; smooth L1 on features + ``token_weight`` x cross-entropy against the target's distribution (the
    head trains in fp32; the target's modules run in their own dtype, frozen)."""
    with torch.no_grad():
        embeds = adapter.embed(ids).to(features.dtype)
        target = features[:, 1:]
        target_probs = torch.softmax(image_logits(adapter, target), dim=-1)
    predicted = net(embeds, features[:, :-1] + noise)
    feature_loss = F.smooth_l1_loss(predicted.float(), target.float())
    log_probs = torch.log_softmax(image_logits(adapter, predicted), dim=-1)
    token_loss = -(target_probs * log_probs).sum(-1).mean()
    agree = (log_probs.argmax(-1) == target_probs.argmax(-1)).float().mean()
    loss = feature_loss + token_weight * token_loss
    return loss, {"loss": loss.item(), "feature": feature_loss.item(), "token": token_loss.item(), "top1": agree.item()}


def batch_at(step: int, data: dict[str, torch.Tensor], size: int, noise: float, seed: int,
             device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step ``step``'s sequences and input noise, from a generator seeded with (seed, step) alone."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    samples, rows = data["features"].shape[:2]
    pick = torch.randint(samples * rows, (size,), generator=gen)
    features = data["features"][pick // rows, pick % rows]
    jitter = (torch.rand(features[:, :-1].shape, generator=gen) - 0.5) * noise
    cast = {"device": device, "dtype": dtype}
    return data["ids"][pick // rows].to(device), features.to(**cast), jitter.to(**cast)


def train(net: torch.nn.Module, adapter: ModelAdapter, data: dict[str, torch.Tensor], args: argparse.Namespace,
          ckpt: Path, loss_fn: LossFn | None = None) -> list[dict[str, float]]:
    """Train ``net`` to ``args.steps``, resuming from ``ckpt/state.pt``; returns the per-step losses (all steps).
    ``loss_fn(ids, features, noise)``: the step's loss and logged values (default: EAGLE's :func:`losses`)."""
    optimiser = torch.optim.AdamW(net.parameters(), lr=args.lr, betas=(0.9, 0.95))
    state_file, step, log = ckpt / "state.pt", 0, []
    if state_file.exists():
        state = torch.load(state_file, weights_only=True)
        net.load_state_dict(state["head"])
        optimiser.load_state_dict(state["optimiser"])
        step, log = state["step"], state["log"]
        print(f"[train] resuming at step {step}", flush=True)

    def save() -> None:
        torch.save({"step": step, "head": net.state_dict(), "optimiser": optimiser.state_dict(), "log": log}, state_file)

    dtype = next(net.parameters()).dtype
    net.train()
    try:
        with tqdm(total=args.steps, initial=step, desc="train") as bar:
            while step < args.steps:
                ids, features, noise = batch_at(step, data, args.batch, args.noise, args.seed, adapter.device, dtype)
                if loss_fn is None:
                    loss, values = losses(net, adapter, ids, features, noise, args.token_weight)
                else:
                    loss, values = loss_fn(ids, features, noise)
                optimiser.zero_grad()
                loss.backward(inputs=list(net.parameters()))  # the target's head stays frozen
                torch.nn.utils.clip_grad_value_(net.parameters(), 0.5)
                optimiser.step()
                step += 1
                log.append(values)
                bar.update(1)
                bar.set_postfix(loss=f"{values['loss']:.3f}", top1=f"{values['top1']:.2f}")
                if step % args.save_every == 0:
                    save()
    finally:  # an interrupted run keeps every finished step
        save()
        net.eval()
    return log


@torch.no_grad()
def accepted_length(adapter: ModelAdapter, head: Path, prompts: list[Prompt], seeds: list[int], window: int,
                    batch: int) -> float:
    """``method=sjd drafter=eagle`` on ``prompts`` (one image each, with ``seeds``): tokens committed per target
    forward."""
    engine = JacobiEngine(adapter, SJD(), EagleDrafter(window=window, head=str(head)), batch_size=batch)
    gens = [gen for _, gen in engine.generate_many([Request(p.text, s) for p, s in zip(prompts, seeds, strict=True)])]
    return sum(g.tokens.numel() for g in gens) / sum(g.nfe for g in gens)


def spatial_pairs(adapter: ModelAdapter, offsets: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training pairs of spatial heads on ``adapter``'s grid: every cell's body position ``[C]``, the body position
    of the cell at each head's offset ``[C, K]`` (clamped) and whether it exists ``[C, K]`` (a horizontal offset stays
    in the cell's row, a vertical one in the grid)."""
    grid = RowGrid(adapter.layout)
    cells = [p for row in grid.cells for p in row]
    count = len(cells)
    index = torch.zeros((count, len(offsets)), dtype=torch.long)
    valid = torch.zeros((count, len(offsets)), dtype=torch.bool)
    for c in range(count):
        for k, o in enumerate(offsets):
            same_row = o >= grid.width or c % grid.width + o < grid.width
            valid[c, k] = c + o < count and same_row
            index[c, k] = cells[min(c + o, count - 1)]
    return torch.tensor(cells), index, valid


def spatial_losses(net: SpatialHeads, adapter: ModelAdapter, pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                   ids: torch.Tensor, features: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """SSD's loss on sequences ``ids [B, N]``, ``features [B, N + 1, D]`` (column ``p``: the feature whose logits gave
    the law of body position ``p``): from every cell ``s``'s ``(h_s + noise, e(x_s))`` head ``k`` predicts
    ``h_{s + o_k}``; SmoothL1 over the valid pairs (:func:`spatial_pairs`). ``top1``: how often the predicted
    feature's argmax code is the target feature's, on the first sequence (the target's head, frozen)."""
    cells, index, valid = (t.to(features.device) for t in pairs)
    with torch.no_grad():
        embedded = adapter.embed(ids[:, cells]).to(features.dtype)
        target = features[:, index]                                            # [B, C, K, D]
    predicted = net.predict_embedded(features[:, cells] + noise[:, cells], embedded)
    per_pair = F.smooth_l1_loss(predicted.float(), target.float(), reduction="none").mean(-1)
    loss = per_pair[:, valid].mean()
    with torch.no_grad():
        agree = (image_logits(adapter, predicted[0][valid]).argmax(-1) == image_logits(adapter, target[0][valid]).argmax(-1))
    return loss, {"loss": loss.item(), "top1": agree.float().mean().item()}


@torch.no_grad()
def spatial_validation(adapter: ModelAdapter, heads: Path, prompts: list[Prompt], seeds: list[int], k_h: int, k_v: int,
                       batch: int) -> dict[str, float]:
    """``method=sjd drafter=ssd`` with ``heads`` on ``prompts`` (prompt ``i``: seed ``seeds[i]``): the acceptance rate
    of the drafts' one correction round (``r = 1``) and the step compression at ``r = 0`` and ``r = 1``."""
    out = {}
    for rounds in (0, 1):
        drafter = SSDDrafter(k_h=k_h, k_v=min(k_v, 2), rounds=rounds, heads=str(heads))
        engine = JacobiEngine(adapter, SJD(), drafter, batch_size=batch)
        gens = [g for _, g in engine.generate_many([Request(p.text, s) for p, s in zip(prompts, seeds, strict=True)])]
        out[f"compression_r{rounds}"] = sum(g.tokens.numel() for g in gens) / sum(g.nfe for g in gens)
        if rounds == 1:
            out["acceptance_r1"] = (sum(g.stats["drafts_accepted"] for g in gens)
                                    / max(sum(g.stats["drafts_verified"] for g in gens), 1))
    return out


def main_spatial(args: argparse.Namespace, cfg: DictConfig, adapter: ModelAdapter, data: dict[str, torch.Tensor],
                 ckpt: Path, meta: dict[str, Any], val_prompts: list[Prompt], start: float) -> dict[str, Any]:
    """``--kind spatial``: train, save and validate SSD's spatial heads (module docstring)."""
    torch.manual_seed(args.seed)
    width = adapter.decoder().config.hidden_size
    net = SpatialHeads(width, adapter.layout.grid[1], args.k_h, args.k_v, args.ffn).to(adapter.device)
    meta = {**meta, "kind": "spatial", "offsets": list(net.offsets)}
    untrained = ckpt / "untrained.pt"
    save_spatial_heads(net, untrained, meta)
    pairs = spatial_pairs(adapter, net.offsets)
    log = train(net, adapter, data, args, ckpt,
                lambda ids, features, noise: spatial_losses(net, adapter, pairs, ids, features, noise))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_spatial_heads(net, args.out, meta)
    load_spatial_heads(args.out, adapter)  # the shipped file loads
    val_seeds = sample_seeds(args.seed, meta["train_prompts"], len(val_prompts), 1)
    before = spatial_validation(adapter, untrained, val_prompts, val_seeds, args.k_h, args.k_v, args.decode_batch)
    after = spatial_validation(adapter, args.out, val_prompts, val_seeds, args.k_h, args.k_v, args.decode_batch)
    report = {**meta, "seconds": round(time.perf_counter() - start, 1), "first_loss": log[0]["loss"],
              "last_loss": log[-1]["loss"], "last_top1": log[-1]["top1"], "bytes": args.out.stat().st_size,
              **{f"val_{k}_untrained": v for k, v in before.items()}, **{f"val_{k}": v for k, v in after.items()}}
    print(json.dumps(report, indent=1), flush=True)
    return report


def main(argv: list[str]) -> dict[str, Any]:
    args, overrides = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = run_config(overrides)
    prompts = load_prompts(cfg.dataset)
    if problem := samples_problem(args.samples_per_prompt):
        raise SystemExit(problem.replace("dataset.samples_per_prompt", "--samples-per-prompt"))
    if len(prompts) <= args.val_prompts:
        raise SystemExit(f"--val-prompts={args.val_prompts} leaves no training prompt of the {len(prompts)} in "
                         f"dataset={cfg.dataset.name}: raise dataset.n_prompts")
    train_prompts, val_prompts = prompts[: -args.val_prompts], prompts[-args.val_prompts :]
    adapter = build_adapter(cfg.model, resolve_device(cfg.device))
    ckpt = args.checkpoint or args.out.with_name(args.out.name + ".ckpt")
    ckpt.mkdir(parents=True, exist_ok=True)
    data_file, start = ckpt / "data.pt", time.perf_counter()
    if data_file.exists():
        data = load_samples(data_file, sample_seeds(args.seed, 0, len(train_prompts), args.samples_per_prompt))
    else:
        data = collect(adapter, train_prompts, args.samples_per_prompt, args.seed, args.decode_batch)
        torch.save(data, data_file)
    meta = {"model": cfg.model.name, "dataset": cfg.dataset.name, "train_prompts": len(train_prompts),
            "samples_per_prompt": args.samples_per_prompt, "steps": args.steps, "seed": args.seed}
    if args.kind == "spatial":
        return main_spatial(args, cfg, adapter, data, ckpt, meta, val_prompts, start)
    torch.manual_seed(args.seed)
    net = EagleHead(head_config(adapter.decoder().config)).to(adapter.device)  # fp32 weights, whatever the target's
    untrained = ckpt / "untrained.pt"
    save_head(net, untrained, meta)
    log = train(net, adapter, data, args, ckpt)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_head(net, args.out, meta)
    load_head(args.out, adapter)  # the shipped file loads
    val_seeds = sample_seeds(args.seed, len(train_prompts), len(val_prompts), 1)
    report = {**meta, "seconds": round(time.perf_counter() - start, 1), "first_loss": log[0]["loss"],
              "last_loss": log[-1]["loss"], "last_top1": log[-1]["top1"],
              "val_accepted_length_untrained": accepted_length(adapter, untrained, val_prompts, val_seeds, args.window,
                                                               args.decode_batch),
              "val_accepted_length": accepted_length(adapter, args.out, val_prompts, val_seeds, args.window,
                                                     args.decode_batch)}
    print(json.dumps(report, indent=1), flush=True)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
