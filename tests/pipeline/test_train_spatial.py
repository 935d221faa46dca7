"""experiments/train_drafter.py --kind spatial (docs/DRAFT_HEADS.md "SSD spatial heads"): the training pairs follow the
heads' offsets, a few steps lower SSD's SmoothL1 loss, an interrupted run resumes at its saved step and ends where an
uninterrupted one does, and every AR sample is drawn with its own seed."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from csd.adapters.toy import load_toy_adapter
from csd.drafters.spatial_heads import SpatialHeads
from experiments import train_drafter


@pytest.fixture(scope="module")
def adapter():
    return load_toy_adapter()


def toy_training(adapter, steps: int) -> tuple[SpatialHeads, argparse.Namespace, dict, train_drafter.LossFn]:
    """Fresh seeded heads, settings for ``steps`` steps, sequences of the toy's shapes whose next cell's feature is a
    fixed map of the cell's (learnable), and the spatial loss."""
    torch.manual_seed(0)
    net = SpatialHeads(192, 16, k_h=2, k_v=1, ffn=8)
    gen = torch.Generator().manual_seed(1)
    features = torch.randn((3, 2, 257, 192), generator=gen)
    features[..., 1:, :] = 0.5 * features[..., :-1, :].roll(1, dims=-1)  # h_{s+1} = 0.5 * shift(h_s)
    data = {"ids": torch.randint(adapter.vocab_size, (3, 256), generator=gen), "features": features}
    args = argparse.Namespace(lr=3e-3, steps=steps, batch=2, noise=0.0, seed=0, token_weight=0.0, save_every=2)
    pairs = train_drafter.spatial_pairs(adapter, net.offsets)
    return net, args, data, lambda i, f, z: train_drafter.spatial_losses(net, adapter, pairs, i, f, z)


def test_pairs_follow_the_offsets(adapter):
    cells, index, valid = train_drafter.spatial_pairs(adapter, (1, 2, 16))
    assert cells.tolist() == list(range(256))  # the toy's raster body: cell = position
    assert index[0].tolist() == [1, 2, 16] and valid[0].all()
    assert valid[14].tolist() == [True, False, True]  # +2 from column 14 leaves the row
    assert valid[250].tolist() == [True, True, False]  # +W from the last row leaves the grid


def test_a_few_steps_lower_the_loss_and_a_resumed_run_ends_where_a_straight_one_does(adapter, tmp_path, monkeypatch):
    straight, args, data, loss_fn = toy_training(adapter, steps=6)
    (tmp_path / "straight").mkdir()
    log = train_drafter.train(straight, adapter, data, args, tmp_path / "straight", loss_fn)
    assert log[-1]["loss"] < log[0]["loss"]

    resumed, _, _, loss_fn = toy_training(adapter, steps=6)
    (tmp_path / "resumed").mkdir()
    calls = []

    def interrupted(*a):  # Ctrl-C during step 4 (after 3 finished steps)
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return loss_fn(*a)

    with pytest.raises(KeyboardInterrupt):
        train_drafter.train(resumed, adapter, data, args, tmp_path / "resumed", interrupted)
    assert torch.load(tmp_path / "resumed" / "state.pt", weights_only=True)["step"] == 3
    resumed, _, _, loss_fn = toy_training(adapter, steps=6)
    log_resumed = train_drafter.train(resumed, adapter, data, args, tmp_path / "resumed", loss_fn)
    assert [r["loss"] for r in log_resumed] == pytest.approx([r["loss"] for r in log])
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b)


def test_every_sample_has_its_own_seed(monkeypatch):
    seeds = []

    class Engine:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def generate_many(self, requests):
            for request in requests:
                seeds.append(request.seed)
                yield request, SimpleNamespace(tokens=torch.zeros(4, dtype=torch.long))

    monkeypatch.setattr(train_drafter, "JacobiEngine", Engine)
    monkeypatch.setattr(train_drafter, "reference_features", lambda adapter, prompt, ids: torch.zeros(1, 5, 2))
    prompts = [SimpleNamespace(text=f"p{i}") for i in range(3)]
    data = train_drafter.collect(SimpleNamespace(device=torch.device("cpu")), prompts, 4, 7, 2)
    assert data["ids"].shape == (12, 4) and len(set(seeds)) == 12 and data["seeds"].tolist() == seeds


def test_the_command_line_names_the_kind(tmp_path: Path):
    args, _ = train_drafter.parse(["--kind", "spatial", "--k-h", "5", "--k-v", "1", "--out", str(tmp_path / "h.pt")])
    assert (args.kind, args.k_h, args.k_v) == ("spatial", 5, 1)
