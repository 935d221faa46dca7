"""PartiPrompts, DPG-Bench and COCO 2014 30k from tiny fixture files (tests/fixtures/): columns, ids, the seeded
draw, and the one-line error naming the fetch command when a file is missing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from csd.compose import load_prompts
from csd.data.coco2014 import coco2014_prompts
from csd.data.dpg import dpg_prompts
from csd.data.parti import parti_prompts
from csd.errors import DatasetFileError, MissingDataError
from csd.validate import validate
from tests.pipeline.test_config import make_cfg

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_parti_reads_prompt_category_and_challenge() -> None:
    prompts = parti_prompts(FIXTURES / "PartiPrompts.tsv")
    assert [p.prompt_id for p in prompts] == ["parti-0000", "parti-0001", "parti-0002"]
    assert prompts[2].text == 'A raccoon wearing a "top hat" and holding a cane'  # TSV: quotes are text
    assert prompts[1].meta == {"index": 1, "category": "Produce & Plants", "challenge": "Basic"}
    assert len(parti_prompts(FIXTURES / "PartiPrompts.tsv", n_prompts=2)) == 2


def test_dpg_groups_questions_with_their_dependencies() -> None:
    prompts = dpg_prompts(FIXTURES / "dpg_bench.csv")
    assert [p.prompt_id for p in prompts] == ["red_cube", "plain_sky"]
    questions = prompts[0].meta["dpg"]["questions"]
    assert [q["parents"] for q in questions] == [[0], [0], [1], [1, 2]]
    assert questions[3] == {"id": 4, "question": "Is the cube beside the ball?", "category": "relation", "parents": [1, 2]}


def test_dpg_refuses_a_dependency_on_a_missing_question(tmp_path: Path) -> None:
    bad = tmp_path / "dpg_bench.csv"
    bad.write_text((FIXTURES / "dpg_bench.csv").read_text().replace('"1,2"', '"1,9"'))
    with pytest.raises(DatasetFileError, match="depends on missing question 9"):
        dpg_prompts(bad)


def test_coco2014_draws_seeded_images_one_caption_each() -> None:
    prompts = coco2014_prompts(FIXTURES / "captions_val2014.json", n_prompts=3, sample_seed=0)
    rng = random.Random(0)  # the draw, written out: images, then a caption of each
    images = rng.sample([11, 12, 13, 14], 3)  # image 15 has no caption
    assert [p.meta["image_id"] for p in prompts] == images
    assert len({p.meta["image_id"] for p in prompts}) == 3 and prompts[0].meta["file_name"].startswith("COCO_val2014_")
    assert prompts == coco2014_prompts(FIXTURES / "captions_val2014.json", n_prompts=3, sample_seed=0)
    assert prompts != coco2014_prompts(FIXTURES / "captions_val2014.json", n_prompts=3, sample_seed=1)
    assert len(coco2014_prompts(FIXTURES / "captions_val2014.json", n_prompts=None)) == 4


@pytest.mark.parametrize(("dataset", "key", "file"), [("partiprompts", "tsv", "PartiPrompts.tsv"),
                                                      ("dpg_bench", "csv_file", "dpg_bench.csv"),
                                                      ("coco2014_30k", "annotations", "captions_val2014.json")])
def test_presets_compose_and_load(dataset: str, key: str, file: str, tmp_path: Path) -> None:
    cfg = make_cfg(f"dataset={dataset}", f"dataset.{key}={FIXTURES / file}", "dataset.n_prompts=2")
    validate(cfg)
    assert len(load_prompts(cfg.dataset)) == 2
    missing = make_cfg(f"dataset={dataset}", f"dataset.{key}={tmp_path / file}")
    with pytest.raises(MissingDataError) as err:
        load_prompts(missing.dataset)
    assert "\n" not in str(err.value) and "bash experiments/download_data.sh" in str(err.value)
