"""Prompt sets from small fixture files: COCO captions, GenEval metadata and its export layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from csd.compose import load_prompts
from csd.data.coco import coco2017_prompts
from csd.data.geneval import export_geneval, geneval_prompts
from csd.errors import ConfigError, MissingDataError
from tests.evaluation.test_eval_fixtures import REPO, make_run


def write_coco(path: Path) -> Path:
    images = [{"id": 42, "file_name": "000000000042.jpg"}, {"id": 7, "file_name": "000000000007.jpg"},
              {"id": 9, "file_name": "000000000009.jpg"}]
    anns = [
        {"id": 101, "image_id": 42, "caption": "a dog"},
        {"id": 102, "image_id": 42, "caption": "a brown dog on grass"},
        {"id": 201, "image_id": 7, "caption": "two red cars "},
        {"id": 202, "image_id": 7, "caption": "six red cars"},  # same length as 201 (stripped): first wins
        {"id": 203, "image_id": 7, "caption": "cars"},
    ]
    path.write_text(json.dumps({"images": images, "annotations": anns}))
    return path


def test_coco_longest_caption_ascending_ids(tmp_path: Path) -> None:
    prompts = coco2017_prompts(write_coco(tmp_path / "captions_val2017.json"))
    assert [p.prompt_id for p in prompts] == ["201", "102"]  # image 9 has no caption
    assert prompts[0].text == "two red cars"
    assert prompts[1].meta == {"image_id": 42, "file_name": "000000000042.jpg"}
    assert len(coco2017_prompts(tmp_path / "captions_val2017.json", n_prompts=1)) == 1


def test_missing_files_name_the_download_script(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match="download_data.sh"):
        coco2017_prompts(tmp_path / "nope.json")
    with pytest.raises(MissingDataError, match="download_data.sh"):
        geneval_prompts(tmp_path / "nope.jsonl")


def test_dataset_configs_instantiate(tmp_path: Path) -> None:
    cfg = OmegaConf.load(REPO / "conf/dataset/coco2017.yaml")
    cfg.annotations = str(write_coco(tmp_path / "c.json"))
    kwargs = {k: v for k, v in cfg.items() if k not in ("name", "samples_per_prompt")}
    assert len(instantiate(OmegaConf.create(kwargs))) == 2
    assert OmegaConf.load(REPO / "conf/dataset/geneval.yaml").samples_per_prompt == 4


def test_geneval_prompts_and_export(tmp_path: Path) -> None:
    lines = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
             {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}],
              "prompt": "a photo of two dogs"}]
    meta = tmp_path / "evaluation_metadata.jsonl"
    meta.write_text("".join(json.dumps(x) + "\n" for x in lines))
    prompts = geneval_prompts(meta)
    assert [p.prompt_id for p in prompts] == ["00000", "00001"] and prompts[1].meta["geneval"] == lines[1]
    run = make_run(tmp_path / "run", n_images=2, metas=[p.meta for p in prompts])
    out = export_geneval(run, tmp_path / "geneval_out")
    assert json.loads((out / "00001" / "metadata.jsonl").read_text()) == lines[1]
    assert (out / "00000" / "samples" / "0000.png").exists()


def test_truncated_coco_json_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "captions_val2017.json"
    text = json.dumps(json.loads(write_coco(path).read_text()), indent=1)
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:\d+:\d+: not valid JSON \(.+\)$"):
        coco2017_prompts(path)


def test_coco_annotation_without_caption_names_the_entry(tmp_path: Path) -> None:
    path = write_coco(tmp_path / "captions_val2017.json")
    data = json.loads(path.read_text())
    del data["annotations"][1]["caption"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: annotation #1 \(id=102\): 'caption' missing or not a string$"):
        coco2017_prompts(path)


@pytest.mark.parametrize(
    ("second_line", "message"),
    [("{not json", r":2: not valid JSON \(.+\)$"), ('{"tag": "counting"}', ":2: no 'prompt' string in this entry$")],
)
def test_bad_geneval_line_names_the_file_and_line(tmp_path: Path, second_line: str, message: str) -> None:
    path = tmp_path / "evaluation_metadata.jsonl"
    path.write_text(json.dumps({"tag": "single_object", "prompt": "a photo of a cat"}) + "\n" + second_line + "\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}{message}"):
        geneval_prompts(path)


def test_empty_dataset_files_say_so(tmp_path: Path) -> None:
    path = tmp_path / "evaluation_metadata.jsonl"
    path.write_text("\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: no prompts"):
        geneval_prompts(path)
    coco = tmp_path / "captions_val2017.json"
    coco.write_text(json.dumps({"images": [{"id": 1}], "annotations": []}))
    with pytest.raises(ConfigError, match=f"^{re.escape(str(coco))}: no prompts"):
        coco2017_prompts(coco)


def test_asking_for_more_prompts_than_the_dataset_has_says_how_many_exist(tmp_path: Path) -> None:
    coco = OmegaConf.load(REPO / "conf/dataset/coco2017.yaml")
    coco.annotations = str(write_coco(tmp_path / "c.json"))
    with pytest.raises(ConfigError, match="dataset.n_prompts=5000, but dataset=coco2017 has only 2 prompts"):
        load_prompts(coco)
    coco.n_prompts = 2
    assert len(load_prompts(coco)) == 2
    smoke = OmegaConf.load(REPO / "conf/dataset/smoke.yaml")
    smoke.n_prompts = 10
    with pytest.raises(ConfigError, match="dataset.n_prompts=10, but dataset=smoke has only 6 prompts"):
        load_prompts(smoke)
