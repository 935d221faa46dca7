"""csd.limits: values at their bound still run (the refusals past it are rows of tests/pipeline/test_bad_inputs.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from csd import limits
from csd.cli import preflight
from csd.drafters.chain import ChainDrafter
from csd.errors import ConfigError
from csd.pipeline import image_seed
from csd.plan import model_shape
from csd.prompts import Prompt
from csd.tree import tree_problem
from csd.validate import validate
from tests.pipeline.test_config import make_cfg

CORES = limits.usable_cores()

#: command lines at the edge of each bound: accepted by everything run.py checks before a model loads
AT_THE_BOUND = [
    ("engine.batch_size=16",),  # the toy dataset's 16 images
    ("engine.batch_size=6", "dataset.n_prompts=3", "dataset.samples_per_prompt=2"),
    ("engine.batch_size=auto",),
    (f"threads={CORES}",),
    ("threads=null",),
    (f"seed={limits.SEED_MODULUS - 1}",),
    (f"dataset.samples_per_prompt={limits.PROMPT_STRIDE}", "dataset.n_prompts=1", "stage=generate"),
    ("engine.warmup=16",),
    ("model.top_k=256",),  # the toy's 256 image codes
    ("drafter.window=256",),  # the toy's 256 image tokens
    ("drafter=draft_model", "drafter.gamma=255"),
    ("drafter=pac_tree", "drafter.depth=3"),  # 21 of the window's 64 nodes
    ("model=janus_pro_tiny", "dataset=smoke", "model.top_k=64", "drafter.window=64"),
    ("eval.metrics=[speed,scene]",),
]


@pytest.mark.parametrize("args", AT_THE_BOUND, ids=" ".join)
def test_a_value_at_its_bound_is_accepted(args: tuple[str, ...], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    preflight(list(args))
    assert list(tmp_path.iterdir()) == []


def test_one_past_the_bound_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args, says in [
        (("engine.batch_size=17",), r"^engine\.batch_size=17 is more than the run's 16 images"),
        ((f"threads={CORES + 1}",), rf"^threads={CORES + 1} is more than the {CORES} cores"),
        ((f"seed={limits.SEED_MODULUS}",), r"^seed=4611686018427387904 must be"),
        ((f"dataset.samples_per_prompt={limits.PROMPT_STRIDE + 1}",), r"^dataset\.samples_per_prompt=1010 must be <= 1009"),
        (("engine.warmup=17",), r"^engine\.warmup=17 is more than the run's 16 images"),
        (("model.top_k=257",), r"^model\.top_k=257 is more than model=toy's 256 image codes"),
        (("drafter.window=257",), r"^drafter\.window=257 is longer than model=toy's image \(256 tokens\)"),
        (("drafter=draft_model", "drafter.gamma=256"), r"^drafter\.gamma=256 drafts windows of 257 entries"),
        (("drafter=pac_tree", "drafter.depth=4"), r"^drafter\.window=64 cannot hold the tree .*depth=4 \(85 nodes"),
    ]:
        with pytest.raises(ConfigError, match=says):
            preflight(list(args))


def test_the_seed_bounds_are_those_of_the_image_seed() -> None:
    """Seeds SEED_MODULUS apart give the same images; sample PROMPT_STRIDE would take the next prompt's seed."""
    assert image_seed(limits.SEED_MODULUS + 7, 3, 2) == image_seed(7, 3, 2)
    assert image_seed(5, 0, limits.PROMPT_STRIDE) == image_seed(5, 1, 0)
    seeds = {image_seed(5, p, s) for p in range(4) for s in range(limits.PROMPT_STRIDE)}
    assert len(seeds) == 4 * limits.PROMPT_STRIDE


def test_memory_bounds_scale_with_the_available_memory() -> None:
    assert limits.bootstrap_problem(1000, 400, 400 * 1000 * limits.RESAMPLE_BYTES) is None
    assert "set eval.bootstrap <= 999" in limits.bootstrap_problem(1000, 400, 400 * 999 * limits.RESAMPLE_BYTES)
    assert limits.bins_problem(20, 20 * limits.BIN_BYTES) is None
    assert "set eval.content.entropy_bins <= 19" in limits.bins_problem(20, 19 * limits.BIN_BYTES)
    cfg = make_cfg("engine.batch_size=2", "dataset.n_prompts=2", "device=cpu", "engine.memory_gb=1e-6")
    with pytest.raises(ConfigError, match=r"^engine\.batch_size=2 needs .* GB by the memory plan of model=toy .* of "
                                          r"engine\.memory_gb: not even one image fits$"):
        validate(cfg)


def test_a_caption_is_bounded_by_the_positions_the_model_holds() -> None:
    cfg = make_cfg("model=janus_pro_tiny")
    shape, drafter = model_shape(cfg.model), ChainDrafter(window=16)
    room = shape.caption_positions - shape.body_len - 16
    fits = [Prompt("a", "x" * room), Prompt("b", "short")]
    assert limits.caption_problem(fits, cfg.model, drafter, "dataset=x") is None
    too_long = [Prompt("a", "short"), Prompt("b", "é" * (room // 2 + 1))]  # two UTF-8 bytes a character
    assert limits.caption_problem(too_long, cfg.model, drafter, "dataset=x") == (
        f"dataset=x: prompt 1 (b) is {2 * (room // 2 + 1)} bytes long; model=janus_pro_tiny holds 1024 positions: its "
        f"image (64 tokens), a window (16) and at most {room} bytes of caption; shorten or drop that prompt")
    toy = make_cfg("model=toy").model  # a fixed-length prompt: any caption
    assert limits.caption_problem(too_long * 100, toy, drafter, "dataset=x") is None


def test_a_huge_tree_depth_is_refused_at_once() -> None:
    start = time.perf_counter()
    problem = tree_problem(64, 4, 10**9, "maximal", False)
    assert time.perf_counter() - start < 1 and len(problem) < 250 and "at most drafter.depth=3" in problem
    assert "the window needs >= 5 nodes" in tree_problem(4, 4, 2, "maximal", False)


def test_a_key_given_twice_is_refused_whatever_its_kind(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args, says in [(("method=sjd", "method=csd"), r"^method is given twice \(method=sjd, method=csd\)"),
                       (("seed=1", "seed=1"), r"^seed is given twice")]:
        with pytest.raises(ConfigError, match=says):
            preflight(list(args))
    assert list(tmp_path.iterdir()) == []


def test_a_prompts_file_larger_than_the_available_ram_is_refused_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    from csd.data.coco import coco2017_prompts
    from csd.data.geneval import geneval_prompts
    from csd.errors import DatasetFileError

    (tmp_path / "meta.jsonl").write_text('{"prompt": "a photo of a cat"}\n')
    (tmp_path / "captions.json").write_text('{"images": [], "annotations": []}')
    assert [p.text for p in geneval_prompts(tmp_path / "meta.jsonl")] == ["a photo of a cat"]
    monkeypatch.setattr("csd.data.files.available_memory", lambda device: 16)
    with pytest.raises(DatasetFileError, match=r"meta\.jsonl: 3.1e-08 GB, more than the 1.6e-08 GB of available RAM"):
        geneval_prompts(tmp_path / "meta.jsonl")
    with pytest.raises(DatasetFileError, match=r"captions\.json: .* GB, more than the 1.6e-08 GB of available RAM"):
        coco2017_prompts(tmp_path / "captions.json")
