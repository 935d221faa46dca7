"""The preference scores, the Inception score and k-NN precision / recall on tiny seeded stand-in networks: the score
maths against hand computations, per-image values, intervals, and the one-line missing-weights errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import open_dict
from PIL import Image
from torch import nn

from csd.errors import MissingWeightsError
from csd.evaluation import inception_metrics as im
from csd.evaluation import preference as pref
from csd.evaluation.context import EvalContext
from csd.evaluation.intervals import Resamples, paired_difference, percentile_interval, run_intervals
from csd.evaluation.metrics import check_files
from tests.evaluation.test_eval_clip import TINY_CLIP
from tests.evaluation.test_eval_fixtures import make_run, solid_image
from tests.pipeline.test_config import make_cfg

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------- Inception score


def test_inception_score_is_exp_of_the_mean_kl_to_the_marginal() -> None:
    one_hot = np.eye(4)
    assert im.inception_score(one_hot, 1) == pytest.approx((4.0, 0.0))  # 4 sure, distinct classes: IS = 4
    assert im.inception_score(np.full((6, 3), 1 / 3), 1)[0] == pytest.approx(1.0)  # uninformative: IS = 1
    probs = np.random.default_rng(0).dirichlet(np.ones(5), size=8)
    marginal = probs.mean(0)
    kl = [sum(p * math.log(p / m) for p, m in zip(row, marginal, strict=True)) for row in probs]  # by hand
    assert im.image_kl(probs) == pytest.approx(kl)
    assert im.inception_score(probs, 1)[0] == pytest.approx(math.exp(np.mean(kl)))
    halves = [im.inception_score(probs[:4], 1)[0], im.inception_score(probs[4:], 1)[0]]
    assert im.inception_score(probs, 2) == pytest.approx((np.mean(halves), np.std(halves)))


def test_inception_score_interval_resamples_prompts() -> None:
    probs = np.random.default_rng(1).dirichlet(np.ones(4) * 0.3, size=12)
    ids = [f"p{i // 2}" for i in range(12)]
    assert im.inception_score_interval(probs, ids, 2, 0) is None
    lo, hi = im.inception_score_interval(probs, ids, 2, 200)
    assert lo < hi and im.inception_score_interval(probs, ids, 2, 200) == [lo, hi]  # seeded


class TinyInception(nn.Module):
    """Seeded stand-in: uint8 images -> their mean colour through a fixed random linear map (``[B, out]``)."""

    def __init__(self, out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(3, out)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(out, 3, generator=torch.Generator().manual_seed(0)) * 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.float().mean(dim=(2, 3)) / 255)


def colour_run(tmp_path: Path, n: int = 8) -> tuple[EvalContext, list[np.ndarray]]:
    images = [solid_image(30 * i, size=16) for i in range(n)]
    run = make_run(tmp_path / "run", n_images=n, images=images)
    cfg = make_cfg().eval
    with open_dict(cfg):
        cfg.bootstrap = 50
    return EvalContext.load(run, cfg, "cpu"), images


def test_inception_score_metric_on_a_stand_in_network(tmp_path: Path, monkeypatch) -> None:
    net = TinyInception(6)
    monkeypatch.setattr(im, "inception_network", lambda output, weights, key: net)
    ctx, images = colour_run(tmp_path)
    with open_dict(ctx.eval):
        ctx.eval.inception_score.splits = 2
    out = im.inception_score_metric(ctx)
    probs = net(torch.stack([torch.from_numpy(i).permute(2, 0, 1) for i in images])).softmax(-1).detach().double().numpy()
    assert out.metrics["inception_score"] == pytest.approx(im.inception_score(probs, 2)[0], rel=1e-5)
    assert out.per_image["is_kl"] == pytest.approx(im.image_kl(probs).tolist(), rel=1e-5)
    lo, hi = out.intervals["inception_score"]
    assert lo <= hi and out.protocol["inception_score"]["splits"] == 2


# ------------------------------------------------------------------------------------------- precision / recall


def test_precision_and_recall_on_points_with_known_answers() -> None:
    reference = np.array([[0.0, 0], [1, 0], [2, 0], [3, 0]])  # k = 1: every radius 1
    generated = np.array([[0.5, 0], [10, 0], [10.5, 0], [11, 0]])  # radii 9.5 (first), 0.5, 0.5, 0.5
    in_ref, recalled, interval = im.precision_recall(generated, reference, k=1)
    assert in_ref.tolist() == [True, False, False, False]  # precision 1/4
    assert recalled.tolist() == [True, True, True, True] and interval is None  # the first ball (9.5) covers all: 1
    assert not im.inside(reference, generated[1:], np.full(3, 0.5)).any()  # the far cluster covers none of them
    assert im.knn_radii(reference, 3).tolist() == [3, 2, 2, 3]
    ids = ["a", "b", "b", "b"]
    assert im.precision_recall(generated, reference, 1, ids, 100)[2] == [0.0, 1.0]  # without prompt a, none recalled
    with pytest.raises(ValueError, match="more than k=3"):
        im.knn_radii(reference[:3], 3)


def full_matrix_precision_recall(generated: np.ndarray, reference: np.ndarray, k: int, ids: list[str],
                                 n_boot: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The definition on whole distance matrices (the implementation the blocked one replaced)."""
    def dist(a, b):
        return torch.cdist(torch.from_numpy(a), torch.from_numpy(b)).numpy()

    def radii(x):
        return np.partition(dist(x, x), k, axis=1)[:, k]

    in_ref = (dist(generated, reference) <= radii(reference)[None]).any(1)
    covered_by = dist(reference, generated) <= radii(generated)[None]
    res = Resamples.draw(ids, n_boot)
    by_prompt = np.zeros((covered_by.shape[0], res.counts.shape[1]))
    np.add.at(by_prompt.T, res.index, covered_by.T.astype(float))
    return in_ref, covered_by.any(1), percentile_interval(((by_prompt @ res.counts.T) > 0).mean(0))


@pytest.mark.parametrize("block_bytes", [im.BLOCK_BYTES, 8 * 60 * 7, 8 * 60])
def test_blocked_precision_and_recall_equal_the_full_matrices_to_the_last_bit(block_bytes, monkeypatch) -> None:
    """In blocks of 7 and of 1 row (as at 50k images with the default budget) and in one block: the manifolds, the
    per-image values and the recall interval equal the full-matrix computation's exactly (features with repeated
    points, so ties at the radius count)."""
    rng = np.random.default_rng(3)
    generated = np.round(rng.normal(size=(60, 5)), 1)
    generated[10:14] = generated[0]
    reference = np.round(rng.normal(size=(50, 5)) + 0.3, 1)
    reference[5] = generated[3]
    ids = [f"p{i // 3}" for i in range(60)]
    monkeypatch.setattr(im, "BLOCK_BYTES", block_bytes)
    in_ref, recalled, interval = im.precision_recall(generated, reference, 3, ids, 200)
    want = full_matrix_precision_recall(generated, reference, 3, ids, 200)
    assert np.array_equal(in_ref, want[0]) and np.array_equal(recalled, want[1]) and interval == want[2]
    assert 0 < in_ref.mean() < 1 and 0 < recalled.mean() < 1


def test_precision_and_recall_memory_grows_with_the_block_not_the_square(monkeypatch) -> None:
    """2,000 generated and 2,000 reference images, a 1 MB block budget: the numpy memory peak (tracemalloc) stays
    a few blocks, where one 2,000 x 2,000 float64 matrix alone is 32 MB (50k images: 20 GB)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    generated, reference = rng.normal(size=(2000, 8)), rng.normal(size=(2000, 8))
    ids = [f"p{i}" for i in range(2000)]
    monkeypatch.setattr(im, "BLOCK_BYTES", 2**20)
    tracemalloc.start()
    try:
        im.precision_recall(generated, reference, 3, ids, 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20


def test_precision_has_per_image_values_intervals_and_paired_deltas() -> None:
    ids = [f"p{i}" for i in range(10)]
    per_image = {"in_reference_manifold": [1, 1, 1, 0, 1, 1, 0, 1, 1, 1]}
    lo, hi = run_intervals(ids, per_image, ["precision"], 200)["precision"]
    assert lo <= 0.8 <= hi
    rows = [{"prompt_id": p, "sample": 0, "in_reference_manifold": v} for p, v in zip(ids, per_image["in_reference_manifold"], strict=True)]
    ref = [{**r, "in_reference_manifold": 1} for r in rows]
    assert paired_difference(rows, ref, "precision", 100).value == pytest.approx(-0.2)


def test_precision_recall_metric_reads_the_reference_folder(tmp_path: Path, monkeypatch) -> None:
    from csd.evaluation import precision_recall

    monkeypatch.setattr(precision_recall, "inception_network", lambda output, weights, key: TinyInception(4))
    ctx, images = colour_run(tmp_path)
    ref = tmp_path / "ref"
    ref.mkdir()
    for i, img in enumerate(images[:4]):  # the reference covers the darker half of the run
        Image.fromarray(img).save(ref / f"{i}.png")
    with open_dict(ctx.eval):
        ctx.eval.fid.reference_dir = str(ref)
        ctx.eval.precision_recall.k = 1
    out = precision_recall.precision_recall_metric(ctx)
    assert out.per_image["in_reference_manifold"][:4] == [1, 1, 1, 1]
    assert out.metrics["precision"] == pytest.approx(np.mean(out.per_image["in_reference_manifold"]))
    assert out.metrics["recall"] == 1.0 and out.protocol["precision_recall"]["n_reference"] == 4


def test_precision_recall_reference_features_are_cached_like_fids(tmp_path: Path, monkeypatch) -> None:
    """A second evaluation against the same reference reads its features from FID's cache directory (only the run's
    images go through the network); a reference file replaced by another image, or a network with other weights under
    the same name, extracts them again; no cache directory, no file."""
    from csd.evaluation import precision_recall

    seen: list[int] = []
    scale = {"value": 5.0}

    class Counting(TinyInception):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(len(x))
            return super().forward(x) * scale["value"]

    def network(output, weights, key):
        net = Counting(4)
        with torch.no_grad():
            net.proj.bias.fill_(scale["value"])
        return net

    monkeypatch.setattr(precision_recall, "inception_network", network)
    ctx, images = colour_run(tmp_path)
    ref = tmp_path / "ref"
    ref.mkdir()
    for i, img in enumerate(images[:4]):
        Image.fromarray(img).save(ref / f"{i}.png")
    with open_dict(ctx.eval):
        ctx.eval.fid.reference_dir = str(ref)
        ctx.eval.fid.cache_dir = str(tmp_path / "cache")
        ctx.eval.precision_recall.k = 1

    def evaluate():
        seen.clear()
        out = precision_recall.precision_recall_metric(ctx)
        return out, sum(seen), out.protocol["precision_recall"]["reference_cached"]

    first, n, cached = evaluate()
    assert (n, cached) == (8 + 4, False)
    second, n, cached = evaluate()
    assert (n, cached) == (8, True) and second.metrics == first.metrics and second.intervals == first.intervals
    Image.fromarray(images[7]).save(ref / "0.png")  # the same size, another image
    third, n, cached = evaluate()
    assert (n, cached) == (8 + 4, False) and third.metrics != first.metrics
    scale["value"] = 6.0  # other weights, the same network name
    assert evaluate()[1:] == (8 + 4, False)
    assert evaluate()[1:] == (8, True)
    with open_dict(ctx.eval):
        ctx.eval.fid.cache_dir = None
    files = set((tmp_path / "cache").iterdir())
    assert evaluate()[1:] == (8 + 4, False) and set((tmp_path / "cache").iterdir()) == files


def test_precision_recall_on_vgg16_features_resizes_every_image_to_224(tmp_path: Path, monkeypatch) -> None:
    from csd.evaluation import precision_recall

    seen = []

    class Stand(TinyInception):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(tuple(x.shape[1:]))
            return super().forward(x)

    monkeypatch.setattr(precision_recall, "vgg16_network", lambda weights, key: Stand(4))
    monkeypatch.setattr(precision_recall, "inception_network", None)  # never asked for
    ctx, images = colour_run(tmp_path)
    ref = tmp_path / "ref"
    ref.mkdir()
    Image.fromarray(solid_image(0, size=40)).resize((40, 30)).save(ref / "0.png")  # another size and aspect
    for i, img in enumerate(images[1:4]):
        Image.fromarray(img).save(ref / f"{i + 1}.png")
    with open_dict(ctx.eval):
        ctx.eval.fid.reference_dir = str(ref)
        ctx.eval.fid.transforms = ["lanczos:64"]  # FID's steps do not apply to the VGG-16 features
        ctx.eval.precision_recall.k = 1
        ctx.eval.precision_recall.features = "vgg16"
    out = precision_recall.precision_recall_metric(ctx)
    assert set(seen) == {(3, 224, 224)}
    assert out.protocol["precision_recall"]["features"].startswith("vgg16-fc2")
    assert out.protocol["precision_recall"]["transforms"] == ["pil_bilinear:224"]
    assert out.per_image["in_reference_manifold"][:4] == [1, 1, 1, 1] and out.metrics["recall"] == 1.0


@pytest.mark.slow
def test_vgg16_features_are_the_released_extractors_on_torchvisions_vgg16() -> None:
    """:class:`VGG16Features` after ``pil_bilinear:224`` on uint8 images equals LANTERN's released extractor
    (``transforms.Resize([224, 224])``, ``ToTensor``, ImageNet ``Normalize``, ``vgg16.features``, the 7 x 7 x 512
    view, ``classifier[:4]``) on torchvision's VGG-16 (seeded random weights: none can be fetched here)."""
    from torchvision import transforms
    from torchvision.models import vgg16

    from csd.evaluation.images import Preprocess, to_tensor

    torch.manual_seed(0)
    vgg = vgg16(weights=None).eval()
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((64, 48), (300, 256))]
    released = transforms.Compose([transforms.Resize([224, 224]), transforms.ToTensor(),
                                   transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    pre = Preprocess(("pil_bilinear:224",))
    with torch.no_grad():
        expected = vgg.classifier[:4](vgg.features(torch.stack([released(i) for i in images])).view(-1, 7 * 7 * 512))
        ours = im.VGG16Features(vgg)(torch.stack([to_tensor(pre(i)) for i in images]))
    assert ours.shape == (2, 4096)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_missing_vgg16_weights_are_one_line_with_the_fetch_command(tmp_path: Path) -> None:
    key = "eval.precision_recall.vgg16_weights"
    cfg = make_cfg("eval.precision_recall.features=vgg16", f"{key}={tmp_path / 'missing.pth'}")
    for check in (lambda: check_files(["precision_recall"], cfg.eval, cfg),
                  lambda: im.vgg16_network(str(tmp_path / "missing.pth"), key)):
        with pytest.raises(MissingWeightsError) as err:
            check()
        assert "\n" not in str(err.value) and key in str(err.value) and "vgg16-397923af.pth" in str(err.value)
    check_files(["precision_recall"], make_cfg("eval=lantern_protocol").eval, cfg)  # null: the hub cache, at load
    assert make_cfg("eval=lantern_protocol").eval.precision_recall.features == "vgg16"


# ------------------------------------------------------------------------------------------- HPSv2.1


def tiny_clip_config(tmp_path: Path) -> str:
    path = tmp_path / "tiny-hps.json"
    path.write_text(json.dumps(TINY_CLIP))
    return str(path)


def test_hpsv2_is_the_cosine_of_the_checkpoints_clip(tmp_path: Path) -> None:
    import open_clip

    config = tiny_clip_config(tmp_path)
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    net = open_clip.create_model("tiny-hps", pretrained=None)
    torch.save({"state_dict": net.state_dict()}, tmp_path / "hps.pt")  # the released file's layout
    clip = pref.load_hpsv2(str(tmp_path / "hps.pt"), CPU, arch="tiny-hps", model_config=config)
    images = [Image.fromarray(solid_image(v)) for v in (20, 200)]
    texts = ["a dark square", "a bright square"]
    scores = pref.hps_scores(clip, images, texts, 1, CPU)
    with torch.no_grad():
        img = net.encode_image(torch.stack([clip.preprocess(i) for i in images]))
        txt = net.encode_text(clip.tokenizer(texts))
    assert scores == pytest.approx(torch.cosine_similarity(img, txt).numpy(), abs=1e-5)


@pytest.mark.parametrize(("metric", "key"), [("hpsv2", "eval.hpsv2.weights"), ("image_reward", "eval.image_reward.weights"),
                                             ("inception_score", "eval.inception_score.inception_weights")])
def test_missing_weights_are_one_line_before_any_model_loads(tmp_path: Path, metric: str, key: str) -> None:
    cfg = make_cfg(f"{key}={tmp_path / 'missing.pt'}")
    with pytest.raises(MissingWeightsError) as err:
        check_files([metric], cfg.eval, cfg)
    assert "\n" not in str(err.value) and key in str(err.value) and "missing.pt" in str(err.value)
    if metric != "inception_score":
        assert "hf download" in str(err.value)


# ------------------------------------------------------------------------------------------- ImageReward


def tiny_image_reward() -> pref.ImageReward:
    from transformers import BlipTextConfig, BlipVisionConfig
    from transformers.models.blip.modeling_blip import BlipVisionModel
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    torch.manual_seed(0)
    vision = BlipVisionModel(BlipVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=32, patch_size=16, layer_norm_eps=1e-6))
    text = BlipTextModel(BlipTextConfig(vocab_size=16, hidden_size=8, encoder_hidden_size=8, intermediate_size=16,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=40,
                                        pad_token_id=0, bos_token_id=None, sep_token_id=None), add_pooling_layer=False)
    return pref.ImageReward(vision, text, pref.RewardHead(8)).eval()


#: ImageReward.pt's names (timm ViT under blip.visual_encoder) -> ours, written out for the tiny model
RELEASED_VIT = {"cls_token": "embeddings.class_embedding", "pos_embed": "embeddings.position_embedding",
                "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
                "patch_embed.proj.bias": "embeddings.patch_embedding.bias", "norm.weight": "post_layernorm.weight",
                "norm.bias": "post_layernorm.bias",
                **{f"blocks.0.{a}.{p}": f"encoder.layers.0.{b}.{p}" for a, b in
                   (("norm1", "layer_norm1"), ("norm2", "layer_norm2"), ("attn.qkv", "self_attn.qkv"),
                    ("attn.proj", "self_attn.projection"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"))
                   for p in ("weight", "bias")}}


def test_image_reward_loads_the_released_names_and_normalises(tmp_path: Path) -> None:
    model = tiny_image_reward()
    ours = model.state_dict()
    released = {f"blip.visual_encoder.{old}": ours[f"vision.{new}"] for old, new in RELEASED_VIT.items()}
    released |= {f"blip.text_encoder.{k[5:]}": v for k, v in ours.items() if k.startswith("text.")}
    released |= {f"mlp.{k[5:]}": v for k, v in ours.items() if k.startswith("head.")}
    assert set(pref.image_reward_state(released)) == set(ours)  # every weight found, none left over
    pixels, ids, mask = torch.randn(2, 3, 32, 32), torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    with torch.no_grad():
        image = model.vision(pixel_values=pixels).last_hidden_state
        h = model.text(input_ids=ids, attention_mask=mask, encoder_hidden_states=image).last_hidden_state[:, 0]
        expected = (model.head(h).squeeze(-1) - 0.16717362830052426) / 1.0333394966054072
    assert model(pixels, ids, mask) == pytest.approx(expected.numpy(), abs=1e-6)


def test_image_rewards_per_image(tmp_path: Path) -> None:
    from transformers import BertTokenizer

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "blue", "square"]) + "\n")
    tokenizer = BertTokenizer(str(vocab))
    model = tiny_image_reward()
    images = [Image.fromarray(solid_image(v, size=40)) for v in (10, 120, 250)]
    texts = ["a red square", "a blue square", "a square"]
    batched = pref.image_rewards(model, tokenizer, images, texts, 2, CPU, size=32)
    single = [pref.image_rewards(model, tokenizer, [i], [t], 1, CPU, size=32)[0] for i, t in zip(images, texts, strict=True)]
    assert batched.shape == (3,) and batched == pytest.approx(single, abs=1e-5)
