"""Reproduce the toy model's assets: tokenizer fit, LM training, CLIP training, AR sample evaluation.

Usage, from the repository root (about 3 h on 2 CPU cores: LM 175 min, CLIP 12, evaluation 2;
``--compile`` shortens LM steps by ~13 %; ``--device cuda`` trains the LM on a GPU)::

    HF_HUB_OFFLINE=1 python -m experiments.train_toy --threads 2

Stages can be run one at a time (``--stages tokenizer lm clip eval``); each reads what earlier
stages wrote to ``--out`` (default ``csd/toy/assets``). The LM trains in ``--phases`` (each with its
own warm-up and cosine decay, continuing the previous one); ``--init-lm DIR`` continues a checkpoint
(its phases are appended to the loss log, or start one); ``--save-every N`` snapshots the LM and the training state,
which ``--resume`` continues exactly where it stopped (model, optimiser, schedule, data stream, loss log).
The evaluation writes ``metrics.json`` into ``--out`` and a grid of samples. The grid and the loss log (unless
``--log`` names one) are the committed ``results/toy_samples_ar.png`` and ``results/toy_training_log.csv``
(``results/toy_textured_...`` for the textured style) when ``--out`` is the style's shipped directory, else
``samples_ar.png`` and ``training_log.csv`` in ``--out``: a candidate leaves the shipped model's files alone.

``--style textured`` trains on the textured domain (``csd.toy.domain.STYLES``); the second embedded model,
``model=toy_textured``, is the shipped LM continued on it (csd/toy/MODEL_CARD.md)::

    HF_HUB_OFFLINE=1 python -m experiments.train_toy --stages lm eval --style textured --init-lm csd/toy/assets/lm \
        --out csd/toy/assets/textured --log results/toy_textured_training_log.csv \
        --phases 3000:5e-4:0.15/0.2/0.5/0.15 --save-every 250 --threads 2
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import csv
import json
import math
import random
import time
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
import torch.nn.functional as F

from csd.adapters.toy import DEFAULT_GUIDANCE
from csd.toy import ASSETS, OUTLINE_DIR, TEXTURED_DIR, TOKENIZER_FILE
from csd.toy.domain import SCENE_KIND_PROBS, STYLES, render_batch, sample_spec, training_stream
from csd.toy.model import IMAGE_TOKENS, ROPE_THETA, toy_lm_config
from csd.toy.tokenizer import PatchTokenizer
from csd.toy.vocab import N_TEXT, PROMPT_LEN, encode_caption

REPO = Path(__file__).resolve().parents[1]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fit_tokenizer(args: argparse.Namespace) -> PatchTokenizer:
    """k-means codebook over the patches of ``--tokenizer-images`` random scenes."""
    rng = np.random.default_rng([args.seed, 1])
    images = render_batch([sample_spec(rng) for _ in range(args.tokenizer_images)], rng)
    tokenizer = PatchTokenizer.fit(images, vocab_size=args.codebook, iters=30, seed=args.seed)
    tokenizer.save(args.out / "tokenizer.safetensors")
    print(f"[tokenizer] {args.codebook} codes from {args.tokenizer_images} images", flush=True)
    return tokenizer


def lm_batch(specs: list, images: np.ndarray, tokenizer: PatchTokenizer, dropout: float,
             rng: np.random.Generator) -> torch.Tensor:
    """Token ids ``[B, PROMPT_LEN + 256]``; a ``dropout`` fraction of captions become the null caption."""
    prompts = torch.stack([encode_caption(None if rng.random() < dropout else s.caption()) for s in specs])
    return torch.cat([prompts, tokenizer.encode(images) + N_TEXT], dim=1)


def image_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the 256 image tokens, over the image-code columns only (as the adapter samples)."""
    hidden = model.model(input_ids=ids[:, :-1]).last_hidden_state[:, PROMPT_LEN - 1:]
    logits = model.lm_head(hidden)[..., N_TEXT:]
    return F.cross_entropy(logits.transpose(1, 2), ids[:, PROMPT_LEN:] - N_TEXT)


#: the shipped recipe, ``steps:peak_lr[:mix]`` per phase (each continues the previous one); the last phase
#: draws half of its captions from the relational kind, the one the LM found hardest
DEFAULT_PHASES = "6000:1.5e-3,1500:5e-4,5000:8e-4:0.15/0.2/0.5/0.15"


def parse_phase(spec: str) -> tuple[int, float, tuple[float, ...]]:
    """``steps:peak_lr[:p_single/p_count/p_relation/p_and]`` -> (steps, lr, caption-kind probabilities)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"phase {spec!r}: expected steps:peak_lr or steps:peak_lr:p1/p2/p3/p4")
    mix = SCENE_KIND_PROBS
    if len(parts) == 3:
        weights = [float(w) for w in parts[2].split("/")]
        if len(weights) != len(SCENE_KIND_PROBS) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"phase {spec!r}: the mix needs {len(SCENE_KIND_PROBS)} non-negative weights")
        mix = tuple(w / sum(weights) for w in weights)
    return int(parts[0]), float(parts[1]), mix


STATE_FILE = "train_state.pt"


def train_phase(model: torch.nn.Module, args: argparse.Namespace, tokenizer: PatchTokenizer, phase: int,
                spec: str, log: TextIO, resume: dict | None = None) -> None:
    """One phase (``spec``, see :func:`parse_phase`): AdamW, 5 % linear warm-up then cosine decay to 5 % of the
    peak lr, on fresh scenes (a new data stream per phase, caption kinds drawn with the phase's mix).

    ``resume`` (a saved :data:`STATE_FILE` of this phase) continues after its step: the optimiser, schedule,
    caption-dropout generator and torch RNG are restored and the data stream skips the batches already used."""
    steps, lr, mix = parse_phase(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.05)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))) * 0.95 + 0.05)
    )
    rng = np.random.default_rng([args.seed, 2, phase])
    stream = training_stream(args.seed + phase - 1, args.batch, mix, args.style)
    writer = csv.writer(log)
    start, smooth, done, elapsed_before = time.time(), None, 0, 0.0
    if resume is not None:
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        rng.bit_generator.state = resume["dropout_rng"]
        torch.set_rng_state(resume["torch_rng"])
        done, smooth, elapsed_before = resume["step"], resume["loss_ema"], resume["elapsed_s"]
        for _ in range(done):
            next(stream)
        print(f"[lm] phase {phase}: resumed after step {done}/{steps}", flush=True)
    loss_fn = torch.compile(image_loss) if args.compile else image_loss
    for step in range(done + 1, steps + 1):
        specs, images = next(stream)
        ids = lm_batch(specs, images, tokenizer, args.caption_dropout, rng).to(args.device)
        loss = loss_fn(model, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % args.log_every == 0 or step == steps:
            elapsed = elapsed_before + time.time() - start
            writer.writerow([phase, step, f"{loss.item():.4f}", f"{smooth:.4f}", f"{sched.get_last_lr()[0]:.2e}",
                             f"{elapsed:.0f}"])
            log.flush()
            print(f"[lm] phase {phase} step {step}/{steps} loss {loss.item():.4f} (ema {smooth:.4f}) "
                  f"{(time.time() - start) / (step - done):.2f}s/step", flush=True)
        if args.save_every and step % args.save_every == 0 and step < steps:
            model.save_pretrained(args.out / "lm")  # the snapshot, then the state that continues it (--resume)
            torch.save({"phase": phase, "step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "dropout_rng": rng.bit_generator.state,
                        "torch_rng": torch.get_rng_state(), "loss_ema": smooth,
                        "elapsed_s": elapsed_before + time.time() - start, "log_bytes": log.tell(),
                        "first_phase": args.first_phase},
                       args.out / STATE_FILE)


def train_lm(args: argparse.Namespace, tokenizer: PatchTokenizer) -> None:
    """Train (or, with ``--init-lm``, continue) the LM through ``--phases``; log to results/toy_training_log.csv."""
    from transformers import LlamaForCausalLM

    seed_everything(args.seed)
    if args.init_lm:
        model = LlamaForCausalLM.from_pretrained(str(args.init_lm))
    else:
        model = LlamaForCausalLM(toy_lm_config(tokenizer.vocab_size, args.hidden, args.layers, args.heads,
                                                 args.rope_theta))
    log_path = args.log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if args.resume and not (args.out / STATE_FILE).exists():
        raise SystemExit(f"--resume: no {args.out / STATE_FILE} (written every --save-every steps); run without --resume")
    state = torch.load(args.out / STATE_FILE, weights_only=False) if args.resume else None
    if state is not None:
        model.load_state_dict(state["model"])
        with open(log_path, "r+") as log:  # drop the rows logged after the saved step
            log.truncate(state["log_bytes"])
    model.to(args.device)
    print(f"[lm] {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, batch {args.batch}", flush=True)
    # continuing a checkpoint appends its phases to an existing log (a resumed run, to its own)
    appended = args.init_lm is not None and log_path.exists()
    first = int(log_path.read_text().strip().splitlines()[-1].split(",")[0]) + 1 if appended else 1
    if state is not None:
        first = state["first_phase"]
    start = time.time()
    with open(log_path, "a" if appended or state is not None else "w", newline="") as log:
        if not appended and state is None:
            csv.writer(log).writerow(["phase", "step", "loss", "loss_ema", "lr", "elapsed_s"])
        args.first_phase = first
        for phase, spec in enumerate(args.phases.split(","), start=first):
            if state is not None and phase < state["phase"]:
                continue
            train_phase(model, args, tokenizer, phase, spec, log, state if state and phase == state["phase"] else None)
    model.save_pretrained(args.out / "lm")
    (args.out / STATE_FILE).unlink(missing_ok=True)  # finished: nothing left to resume
    print(f"[lm] saved to {args.out / 'lm'} after {time.time() - start:.0f}s", flush=True)


def train_clip(args: argparse.Namespace, tokenizer: PatchTokenizer) -> None:
    """Contrastive training on tokenizer-reconstructed scenes (the look of generated images).

    Captions repeat within a batch (the grammar is finite), so every pair with the same caption is a
    positive: the targets are the row-normalised caption-equality matrix.
    """
    import open_clip
    from safetensors.torch import save_file

    from csd.toy.clip import CLIP_NAME, WEIGHTS_FILE, image_tensor, register_toy_clip, retrieval_accuracy

    seed_everything(args.seed)
    register_toy_clip()
    model = open_clip.create_model(CLIP_NAME)
    clip_tokenizer = open_clip.get_tokenizer(CLIP_NAME)
    opt = torch.optim.AdamW(model.parameters(), lr=args.clip_lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.clip_lr, total_steps=args.clip_steps, pct_start=0.1)
    stream = training_stream(args.seed + 1, args.clip_batch)
    start = time.time()
    for step in range(1, args.clip_steps + 1):
        specs, images = next(stream)
        captions = [s.caption() for s in specs]
        img = model.encode_image(image_tensor(tokenizer.decode(tokenizer.encode(images))), normalize=True)
        txt = model.encode_text(clip_tokenizer(captions), normalize=True)
        logits = model.logit_scale.exp() * img @ txt.T
        same = torch.tensor([[a == b for b in captions] for a in captions], dtype=torch.float32)
        targets = same / same.sum(-1, keepdim=True)
        loss = 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        if step % args.log_every == 0 or step == args.clip_steps:
            print(f"[clip] step {step}/{args.clip_steps} loss {loss.item():.4f} "
                  f"{(time.time() - start) / step:.2f}s/step", flush=True)
    model.eval()
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    (args.out / "clip").mkdir(exist_ok=True)
    save_file(state, str(args.out / "clip" / WEIGHTS_FILE.name))
    from csd.toy.domain import heldout_prompts, heldout_scene

    prompts = heldout_prompts(256)
    images = tokenizer.decode(tokenizer.encode(np.stack([heldout_scene(p)[0] for p in prompts]))).numpy()
    accs = [retrieval_accuracy(model, clip_tokenizer, images[i:i + 64], [p.text for p in prompts[i:i + 64]])
            for i in range(0, 256, 64)]
    print(f"[clip] saved; held-out image->text top-1 among 64: {np.mean(accs):.3f} (per block {accs})", flush=True)


@torch.no_grad()
def sample_ar(lm: torch.nn.Module, captions: list[str], guidance: float, seed: int,
              temperature: float = 1.0) -> torch.Tensor:
    """Plain AR sampling of codes ``[B, 256]``: softmax of the CFG-combined image-code logits, multinomial.

    A batched stand-in for the engine's AR mode (``l = l_u + s (l_c - l_u)``, no top-k).
    """
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    cfg = guidance != 1.0
    ids = torch.stack([encode_caption(c) for c in captions])
    if cfg:
        ids = torch.cat([ids, encode_caption(None).expand_as(ids)])
    cache = DynamicCache(config=lm.config)
    hidden = lm.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state[:, -1]
    codes = []
    for _ in range(IMAGE_TOKENS):
        logits = lm.lm_head(hidden)[:, N_TEXT:]
        if cfg:
            cond, uncond = logits.chunk(2)
            logits = uncond + guidance * (cond - uncond)
        code = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
        codes.append(code)
        step = code + N_TEXT
        hidden = lm.model(input_ids=torch.cat([step, step]) if cfg else step, cache=cache,
                          use_cache=True).last_hidden_state[:, -1]
    return torch.cat(codes, dim=1)


def passes(images: np.ndarray, prompts: list) -> list[bool]:
    """Scene-checker verdict (``overall``) per image."""
    from csd.toy.checker import check_image

    return [bool(check_image(im, p.meta)["overall"]) for im, p in zip(images, prompts, strict=True)]


def pass_rate(images: np.ndarray, prompts: list) -> float:
    return float(np.mean(passes(images, prompts)))


def caption_kind(meta: dict) -> str:
    """Evaluation bucket of a prompt: one object, counted group, "and", or relation (horizontal / vertical)."""
    groups, relation = meta["groups"], meta["relation"]
    if len(groups) == 1:
        return "one object" if groups[0]["count"] == 1 else "counted group"
    if relation is None:
        return "and"
    return "left of / right of" if relation in ("left of", "right of") else "above / below"


def save_grid(images: np.ndarray, captions: list[str], path: Path, scale: int = 4) -> None:
    """Rows = prompts (caption at the left), columns = seeds; ``images`` is ``[rows, cols, 32, 32, 3]``."""
    from PIL import Image, ImageDraw

    rows, cols = images.shape[:2]
    cell, text_w = 32 * scale + 4, 390
    canvas = Image.new("RGB", (text_w + cols * cell, rows * cell), "white")
    draw = ImageDraw.Draw(canvas)
    for r in range(rows):
        draw.text((4, r * cell + cell // 2 - 6), captions[r], fill="black")
        for c in range(cols):
            tile = Image.fromarray(images[r, c]).resize((32 * scale, 32 * scale), Image.NEAREST)
            canvas.paste(tile, (text_w + c * cell + 2, r * cell + 2))
    path.parent.mkdir(exist_ok=True)
    canvas.save(path)


def evaluate(args: argparse.Namespace, tokenizer: PatchTokenizer) -> None:
    """Checker sanity (real / reconstructed / random tokens), guidance sweep, AR pass rate, sample grid."""
    from csd.toy.clip import clip_scores, load_toy_clip
    from csd.toy.domain import heldout_prompts, heldout_scene
    from csd.toy.model import load_toy_lm

    metrics: dict = {}
    prompts = heldout_prompts(args.eval_prompts)
    real = np.stack([heldout_scene(p, args.style)[0] for p in heldout_prompts(256)])
    recon = tokenizer.decode(tokenizer.encode(real)).numpy()
    noise = tokenizer.decode(torch.randint(0, tokenizer.vocab_size, (256, IMAGE_TOKENS),
                                           generator=torch.Generator().manual_seed(args.seed))).numpy()
    for name, images in (("real", real), ("reconstructed", recon), ("random_tokens", noise)):
        metrics[f"checker_{name}"] = pass_rate(images, heldout_prompts(256))
    print(f"[eval] checker pass rate: {metrics}", flush=True)

    lm = load_toy_lm(args.out / "lm")
    captions = [p.text for p in prompts]
    sweep = {}
    for g in args.guidance_sweep:
        sweep[g] = pass_rate(tokenizer.decode(sample_ar(lm, captions, g, seed=0)).numpy(), prompts)
        print(f"[eval] guidance {g}: AR pass rate {sweep[g]:.3f}", flush=True)
    metrics["guidance_sweep_seed0"] = sweep
    per_seed, samples, by_kind = [], [], {}
    for seed in range(args.eval_seeds):
        images = tokenizer.decode(sample_ar(lm, captions, args.guidance, seed=1000 + seed)).numpy()
        samples.append(images)
        verdicts = passes(images, prompts)
        per_seed.append(float(np.mean(verdicts)))
        for ok, prompt in zip(verdicts, prompts, strict=True):
            counts = by_kind.setdefault(caption_kind(prompt.meta), [0, 0])
            counts[0] += ok
            counts[1] += 1
    samples_arr = np.stack(samples, axis=1)  # [prompts, seeds, 32, 32, 3]
    distinct = np.mean([len({s.tobytes() for s in samples_arr[i]}) == args.eval_seeds for i in range(len(prompts))])
    clip_model, _, clip_tok = load_toy_clip()
    matched = clip_scores(clip_model, clip_tok, samples_arr[:, 0], captions).mean().item()
    shuffled = clip_scores(clip_model, clip_tok, samples_arr[:, 0], captions[1:] + captions[:1]).mean().item()
    metrics.update({
        "guidance": args.guidance, "ar_pass_rate_per_seed": per_seed, "ar_pass_rate": float(np.mean(per_seed)),
        "prompts_with_all_seeds_distinct": float(distinct), "clip_score_matched": matched,
        "clip_score_shuffled": shuffled, "eval_prompts": len(prompts),
        "ar_passed_by_caption_kind": {kind: f"{ok}/{n}" for kind, (ok, n) in sorted(by_kind.items())},
    })
    print(f"[eval] guidance {args.guidance}: AR pass rate {np.mean(per_seed):.3f} per seed {per_seed}; "
          f"all-seeds-distinct {distinct:.2f}; CLIP score {matched:.1f} (shuffled {shuffled:.1f}); "
          f"passed by caption kind {metrics['ar_passed_by_caption_kind']}", flush=True)
    save_grid(samples_arr[:8], captions[:8], sample_grid_path(args.out, args.style))
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def _committed(out: Path, style: str, name: str) -> Path:
    """``results/toy_<name>`` (``toy_<style>_<name>`` for a style other than clean), the file committed for the
    shipped model, when ``out`` is the style's shipped assets directory; else ``out/<name>``, so a candidate trained
    or evaluated elsewhere never overwrites or appends to the shipped model's files."""
    shipped = {"clean": ASSETS, "textured": TEXTURED_DIR, "textured_outline": OUTLINE_DIR}[style]
    if out.resolve() != shipped.resolve():
        return out / name
    return REPO / "results" / (f"toy_{name}" if style == "clean" else f"toy_{style}_{name}")


def sample_grid_path(out: Path, style: str) -> Path:
    """Where the evaluation's sample grid goes (csd/toy/MODEL_CARD.md shows the committed ones): :func:`_committed`."""
    return _committed(out, style, "samples_ar.png")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.train_toy",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", nargs="+", default=["tokenizer", "lm", "clip", "eval"],
                   choices=["tokenizer", "lm", "clip", "eval"])
    p.add_argument("--out", type=Path, default=ASSETS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="device of the LM stage (e.g. cuda); the other stages run on the CPU")
    p.add_argument("--log", type=Path, default=None,
                   help="LM loss log (CSV); default: the committed results/toy_training_log.csv "
                        "(results/toy_textured_training_log.csv) when --out is the style's shipped directory, "
                        "else --out/training_log.csv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--codebook", type=int, default=256)
    p.add_argument("--tokenizer-images", type=int, default=3000)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--rope-theta", type=float, default=ROPE_THETA,
                   help="RoPE base of a new LM (1768 at head size 32: one frequency pair per 16-token image row)")
    p.add_argument("--phases", default=DEFAULT_PHASES,
                   help="LM phases, steps:peak_lr[:mix],... (batches of fresh scenes; mix = caption-kind weights "
                        "single/count/relation/and, default the held-out mix)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--compile", action="store_true", help="torch.compile the LM loss (about 1.15x per step on 2 CPU cores)")
    p.add_argument("--init-lm", type=Path, default=None,
                   help="continue training this checkpoint (the log is appended to, or started)")
    p.add_argument("--resume", action="store_true",
                   help=f"continue an interrupted run from --out's {STATE_FILE} (written every --save-every steps)")
    p.add_argument("--style", choices=STYLES, default="clean",
                   help="the domain's style (textured: model=toy_textured's backgrounds; textured_outline: those and "
                        "jittered object outlines, the outline candidate's data)")
    p.add_argument("--caption-dropout", type=float, default=0.1)
    p.add_argument("--clip-steps", type=int, default=500)
    p.add_argument("--clip-batch", type=int, default=96)
    p.add_argument("--clip-lr", type=float, default=2e-3)
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--eval-seeds", type=int, default=4)
    p.add_argument("--guidance", type=float, default=DEFAULT_GUIDANCE,
                   help="guidance of the AR evaluation samples (default: the adapter's)")
    p.add_argument("--guidance-sweep", type=float, nargs="*", default=[1.0, 1.5, 2.0, 3.0, 5.0])
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--save-every", type=int, default=0, help="also save the LM every N steps of a phase (0: at the end)")
    args = p.parse_args()
    if args.log is None:
        args.log = _committed(args.out, args.style, "training_log.csv")
    for spec in args.phases.split(","):  # reject a bad phase before any training
        try:
            parse_phase(spec)
        except ValueError as err:
            p.error(str(err))
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    own = args.out / "tokenizer.safetensors"  # --out's tokenizer, else the shipped one (the textured toy shares it)
    tokenizer = fit_tokenizer(args) if "tokenizer" in args.stages else PatchTokenizer.load(
        own if own.exists() else TOKENIZER_FILE)
    if "lm" in args.stages:
        train_lm(args, tokenizer)
    if "clip" in args.stages:
        train_clip(args, tokenizer)
    if "eval" in args.stages:
        evaluate(args, tokenizer)


if __name__ == "__main__":
    main()
