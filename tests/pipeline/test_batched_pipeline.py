"""The batched generate stage: same images as batch 1, refill, null latencies + probe, resume after a kill."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from omegaconf import open_dict

from csd.engine import JacobiEngine
from csd.errors import ConfigError
from csd.evaluation.speed import speed_metrics
from csd.pipeline import GenerationInterrupted, generate_run, run_info_file
from csd.ragged import SlotBatch
from csd.records import RECORDS_FILE, load_records
from csd.validate import validate
from experiments import bench_throughput
from tests.pipeline.test_config import make_cfg

#: record fields that depend only on (prompt, seed): equal at every batch size
IMAGE_FIELDS = (
    "seed", "tokens", "nfe", "iterations", "step_compression", "drafts_proposed", "drafts_verified", "drafts_accepted",
    "relaxed_accepts", "filter_checks", "filter_passes", "commit_iter", "commit_kind", "entropy",
)
TIME_FIELDS = ("prefill_s", "decode_s", "latency_s")


def toy_cfg(run_dir: Path, n_prompts: int, *overrides: str):
    """The embedded toy model, CSD, fp32 on one CPU thread."""
    cfg = make_cfg(
        "model=toy", "dataset=toy", f"dataset.n_prompts={n_prompts}", "method=csd", "device=cpu", "engine.progress=false",
        "engine.warmup=0", "logger=disabled", *overrides,
    )
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
    return cfg


def by_key(run_dir: Path) -> dict[tuple[str, int], dict]:
    records = load_records(run_dir)
    keys = [(r["prompt_id"], r["sample"]) for r in records]
    assert len(set(keys)) == len(keys), f"duplicate records: {keys}"
    return dict(zip(keys, records, strict=True))


def assert_same_images(run: dict, reference: dict) -> None:
    for key, record in run.items():
        for field in IMAGE_FIELDS:
            assert record[field] == reference[key][field], f"{key} {field}"


@pytest.fixture(scope="module")
def batch1(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], dict]:
    """Records of the 5-image run at batch 1 (the reference every batched run must reproduce)."""
    run_dir = generate_run(toy_cfg(tmp_path_factory.mktemp("b1"), 5))
    records = by_key(run_dir)
    assert len(records) == 5
    for record in records.values():
        assert record["batch_size"] == 1 and all(record[f] > 0 for f in TIME_FIELDS)
    assert json.loads((run_dir / "run.json").read_text())["batch_size"] == 1
    return records


@pytest.mark.slow
def test_batched_run_refills_and_matches_batch_1_with_a_latency_probe(tmp_path, monkeypatch, batch1):
    calls: list[tuple[str, int]] = []  # (SlotBatch method, its batch size / slot argument; -1 for forwards)

    def spy(name: str, label: str, arg: int | None) -> None:
        method = getattr(SlotBatch, name)

        def wrapper(self, *args, **kwargs):
            calls.append((label, -1 if arg is None else args[arg]))
            return method(self, *args, **kwargs)

        monkeypatch.setattr(SlotBatch, name, wrapper)

    spy("__init__", "start_batch", 1), spy("prefill", "prefill_slot", 0), spy("forward", "forward_batch", None)
    # 5 images through 2 slots: the rows that finish first take the next images, the last batch is half empty
    run_dir = generate_run(toy_cfg(tmp_path, 5, "engine.batch_size=2", "engine.latency_probe=2"))
    records = by_key(run_dir)
    assert records.keys() == batch1.keys()
    assert_same_images(records, batch1)
    assert calls[0] == ("start_batch", 2) and calls.count(("start_batch", 2)) == 1  # one pass, refilled slots
    batched = calls[: calls.index(("start_batch", 1))]  # then the probe's batch-1 engine
    assert sorted({slot for name, slot in batched if name == "prefill_slot"}) == [0, 1]
    assert sum(name == "prefill_slot" for name, _ in batched) == 5
    # both slots share each forward until the tail: fewer forwards than the images' NFEs add up to
    assert sum(name == "forward_batch" for name, _ in batched) < sum(r["nfe"] for r in batch1.values())
    for record in records.values():
        assert record["batch_size"] == 2 and all(record[f] is None for f in TIME_FIELDS)
        assert record["vq_decode_s"] >= 0

    info = json.loads((run_dir / "run.json").read_text())
    assert info["batch_size"] == 2 and info["throughput_images"] == 5 and info["throughput_images_per_s"] > 0
    probe = info["latency_probe"]
    assert [(p["prompt_id"], p["sample"]) for p in probe] == list(batch1)[:2]
    assert all(p["tokens_match"] and p["latency_s"] > 0 for p in probe)
    assert [p["nfe"] for p in probe] == [r["nfe"] for r in list(batch1.values())[:2]]

    metrics = speed_metrics(load_records(run_dir), info)
    assert metrics["latency_images"] == 2
    assert metrics["latency_mean"] == pytest.approx(sum(p["latency_s"] for p in probe) / 2)
    assert metrics["throughput_images_per_s"] == info["throughput_images_per_s"]
    assert metrics["nfe_mean"] == pytest.approx(sum(r["nfe"] for r in batch1.values()) / 5)


@pytest.mark.slow
def test_fewer_images_than_slots(tmp_path, batch1):
    """A batch larger than the run's images is refused (csd.limits); a shard still decodes fewer images than slots:
    shard 1 of 2 holds one of the 5 (toy-0004)."""
    with pytest.raises(ConfigError, match=r"^engine\.batch_size=6 is more than the run's 5 images"):
        generate_run(toy_cfg(tmp_path / "refused", 5, "engine.batch_size=6"))
    cfg = toy_cfg(tmp_path, 5, "engine.batch_size=4", "dataset.num_shards=2", "dataset.shard=1")
    run_dir = generate_run(cfg)
    records = by_key(run_dir)
    assert list(records) == [("toy-0004", 0)]
    assert_same_images(records, batch1)
    assert "latency_probe" not in json.loads((run_dir / run_info_file(cfg)).read_text())


@pytest.mark.slow
def test_kill_mid_batch_then_resume(tmp_path, monkeypatch, batch1):
    class Killed(JacobiEngine):
        """Ctrl-C after two finished images, with three in flight."""

        def generate_many(self, requests):
            for done, result in enumerate(super().generate_many(requests)):
                if done == 2:
                    raise KeyboardInterrupt
                yield result

    monkeypatch.setattr("csd.pipeline.JacobiEngine", Killed)
    with pytest.raises(GenerationInterrupted, match="2 of 5 images saved"):
        generate_run(toy_cfg(tmp_path, 5, "engine.batch_size=3"))
    assert len(load_records(tmp_path)) == 2
    monkeypatch.undo()

    generate_run(toy_cfg(tmp_path, 5, "engine.batch_size=2"))  # batch_size may change on resume: same images
    lines = (tmp_path / RECORDS_FILE).read_text().splitlines()
    records = by_key(tmp_path)
    assert len(lines) == 5 and records.keys() == batch1.keys()
    assert_same_images(records, batch1)
    assert json.loads((tmp_path / "run.json").read_text())["throughput_images"] == 3


def test_batch_config_is_validated():
    validate(make_cfg("engine.batch_size=16", "engine.latency_probe=4", "engine.compile=true"))
    with pytest.raises(ConfigError, match=r"^engine\.batch_size=0 must be"):
        validate(make_cfg("engine.batch_size=0"))
    with pytest.raises(ConfigError, match=r"^engine\.latency_probe=-1 must be"):
        validate(make_cfg("engine.latency_probe=-1"))


def test_speed_metrics_use_batch_1_latencies_only():
    def record(latency: float | None) -> dict:
        return {"latency_s": latency, "prefill_s": None if latency is None else 0.5, "decode_s": latency and latency - 0.5,
                "vq_decode_s": 0.1, "nfe": 4, "step_compression": 2.0, "drafts_proposed": 6, "drafts_verified": 5,
                "drafts_accepted": 4, "relaxed_accepts": 1, "filter_checks": 2, "filter_passes": 1}

    batched = [record(None), record(None)]
    m = speed_metrics(batched, {"throughput_images_per_s": 8.0})
    assert m["latency_images"] == 0 and math.isnan(m["latency_mean"]) and math.isnan(m["decode_s_mean"])
    assert m["throughput_images_per_s"] == 8.0 and m["nfe_mean"] == 4
    probe = [{"latency_s": 3.0, "prefill_s": 1.0, "decode_s": 2.0}]
    m = speed_metrics([record(1.0), *batched], {"latency_probe": probe})  # a batch-1 pass resumed batched
    assert m["latency_images"] == 2 and m["latency_mean"] == pytest.approx(2.0) and m["prefill_s_mean"] == pytest.approx(0.75)
    assert math.isnan(speed_metrics([record(1.0)])["throughput_images_per_s"])


def test_bench_throughput_smoke(tmp_path):
    res = bench_throughput.main([
        "--model", "janus_pro_tiny", "--methods", "ar,csd", "--batch-sizes", "1,3", "--images", "3", "--device", "cpu",
        "--out", str(tmp_path),
    ])
    for by_batch in res["methods"].values():
        assert [r["images"] for r in by_batch.values()] == [3, 6]
        assert all(r["compared"] == 3 and r["mismatches"] == 0 and r["images_per_s"] > 0 for r in by_batch.values())
        # every slot busy from the first completion until the queue runs dry: a rate is measured at both B
        assert all(r["steady_images_per_s"] > 0 for r in by_batch.values())
    assert "| csd | 3 | 6 |" in (tmp_path / "throughput_janus_pro_tiny_cpu.md").read_text()


@pytest.mark.slow
def test_compiled_batched_run_with_a_latency_probe(tmp_path, batch1):
    cfg = toy_cfg(tmp_path, 3, "engine.compile=true", "engine.compile_backend=aot_eager", "engine.batch_size=2",
                  "engine.latency_probe=1", "engine.warmup=1")
    records = by_key(generate_run(cfg))
    assert list(records) == list(batch1)[:3]
    assert_same_images(records, batch1)
    (probe,) = json.loads((tmp_path / "run.json").read_text())["latency_probe"]
    assert probe["tokens_match"] and probe["nfe"] == next(iter(batch1.values()))["nfe"]
