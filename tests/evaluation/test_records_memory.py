"""Records at scale (docs/PERFORMANCE.md, "Scale"): the evaluate stage holds a run's per-token fields as typed arrays,
not Python lists (~140 bytes a token: 1.3 MB an image at ~9,300 tokens, 39 GB for 30k images), records files are
read line by line, and the HTML report keeps only the records of the images it shows. The values are the same: the
metrics and the records digest of compact records equal those of the lists."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from csd.evaluate import compute_metrics
from csd.evaluation.context import EvalContext
from csd.records import PER_TOKEN_FIELDS, RECORDS_FILE, load_records, records_digest
from experiments.synth_run import synth_record

TOKENS = 4096
IMAGES = 24
TEMPLATE = {"method": "sjd", "method_params": {"window": 16}, "model": "janus_pro_1b",
            "meta": {}, "batch_size": 1}


def write_records(run_dir: Path, n: int = IMAGES, tokens: int = TOKENS) -> Path:
    """A run directory of ``n`` synthetic records of ``tokens`` tokens (rows of 64; no images) and its run.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    template = TEMPLATE | {"grid": [tokens // 64, 64]}
    with open(run_dir / RECORDS_FILE, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(asdict(synth_record(template, i, rng, 16384, tokens)), separators=(",", ":")) + "\n")
    info = {k: TEMPLATE[k] for k in ("method", "method_params", "model")} | {"n_images": n, "dataset": "synthetic"}
    (run_dir / "run.json").write_text(json.dumps(info), encoding="utf-8")
    return run_dir


def eval_cfg():
    return OmegaConf.create({"metrics": ["speed", "content"], "strict": True, "bootstrap": 0,
                             "content": {"entropy_bins": 20}, "toy": {"models": ["toy"]}})


def test_evaluation_holds_per_token_fields_in_typed_arrays(tmp_path: Path) -> None:
    """Loading a run for evaluation peaks under 40 bytes a token (the lists: ~140, the JSON text itself ~12)."""
    run = write_records(tmp_path / "run")
    tracemalloc.start()
    try:
        ctx = EvalContext.load(run, eval_cfg(), "cpu")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ctx.records) == IMAGES
    per_token = peak / (IMAGES * TOKENS)
    assert per_token < 40, f"{per_token:.0f} bytes a token to load the run's records"
    assert all(isinstance(ctx.records[0][field], np.ndarray) for field in PER_TOKEN_FIELDS)


def test_compact_records_give_the_same_metrics_and_digest(tmp_path: Path) -> None:
    run = write_records(tmp_path / "run", n=6, tokens=512)
    ctx = EvalContext.load(run, eval_cfg(), "cpu")
    lists = load_records(run)
    assert records_digest(ctx.records) == records_digest(lists)
    for field in PER_TOKEN_FIELDS:
        assert [r[field].tolist() for r in ctx.records] == [r[field] for r in lists]
    compact = {"metrics": {}, "protocol": {}, "content": {}, "intervals": {}, "skipped": {}}
    per_image = compute_metrics(ctx, ["speed", "content"], compact)
    ctx.records = lists
    plain = {"metrics": {}, "protocol": {}, "content": {}, "intervals": {}, "skipped": {}}
    assert compute_metrics(ctx, ["speed", "content"], plain) == per_image
    assert json.dumps(compact, default=np.ndarray.tolist) == json.dumps(plain, default=np.ndarray.tolist)


def test_only_the_chosen_records_are_kept(tmp_path: Path) -> None:
    run = write_records(tmp_path / "run", n=8, tokens=64)
    keys = {("synth-000003", 0), ("synth-000005", 0), ("absent", 0)}
    got = load_records(run, keys=keys)
    assert [(r["prompt_id"], r["sample"]) for r in got] == [("synth-000003", 0), ("synth-000005", 0)]


@pytest.mark.parametrize("tail", [b"", b'{"prompt_id": "cut'])
def test_records_are_read_line_by_line_and_a_cut_tail_is_left_out(tmp_path: Path, tail: bytes) -> None:
    """The file is not read whole (that peaks at twice its size): reading 96 records peaks under a quarter of it."""
    run = write_records(tmp_path / "run", n=96, tokens=1024)
    with open(run / RECORDS_FILE, "ab") as f:
        f.write(tail)
    size = (run / RECORDS_FILE).stat().st_size
    tracemalloc.start()
    try:
        n = len(load_records(run, keys=set()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 0
    assert peak < size / 4, f"{peak / 1e6:.2f} MB to read a {size / 1e6:.2f} MB file"
    assert len(load_records(run)) == 96
