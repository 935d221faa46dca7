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


def stacked_maps(records: list[dict]) -> dict[str, np.ndarray]:
    """The maps' definition over every image at once (per-cell means of stacked grids)."""
    from csd.evaluation.content import on_grid
    from csd.records import COMMIT_ACCEPTED, COMMIT_RELAXED

    kinds = np.stack([on_grid(r, "commit_kind") for r in records])
    iters = np.stack([on_grid(r, "commit_iter") for r in records]).astype(float)
    iters /= np.maximum(iters.reshape(len(records), -1).max(axis=1), 1)[:, None, None]
    return {"accepted": np.isin(kinds, (COMMIT_ACCEPTED, COMMIT_RELAXED)).mean(axis=0),
            "relaxed": (kinds == COMMIT_RELAXED).mean(axis=0), "commit_iter": iters.mean(axis=0)}


@pytest.mark.parametrize("bins", [7, [0.0, 1.0, 2.5, 8.0]])
def test_content_metrics_pass_over_images_one_at_a_time(tmp_path: Path, bins) -> None:
    """The acceptance maps and the acceptance-by-entropy curve equal their all-at-once definitions to the bit, and
    their memory peak (above the records') is a few images' arrays, not all of them: under a third of the 24 images'
    (all at once: 1.6 times them)."""
    from csd.evaluation.content import acceptance_by_entropy, acceptance_maps

    records = EvalContext.load(write_records(tmp_path / "run"), eval_cfg(), "cpu").records
    for r in records[::3]:
        r["commit_kind"][::5] = 2  # some relaxed accepts
    held = sum(r[f].nbytes for r in records for f in PER_TOKEN_FIELDS)
    tracemalloc.start()
    try:
        maps = acceptance_maps(records)
        curve = acceptance_by_entropy(records, bins)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for key, value in stacked_maps(records).items():
        assert maps[key].tobytes() == value.tobytes(), key
    kinds = np.concatenate([r["commit_kind"] for r in records])
    ent = np.concatenate([r["entropy"] for r in records])
    edges = np.histogram_bin_edges(ent, bins=bins)
    idx = np.clip(np.digitize(ent, edges[1:-1]), 0, len(edges) - 2)
    counts = np.bincount(idx, minlength=len(edges) - 1)
    assert curve["edges"] == edges.tolist() and curve["count"] == counts.tolist()
    accepted = np.bincount(idx, weights=np.isin(kinds, (1, 2)), minlength=len(counts)) / counts
    assert np.array_equal(curve["accepted"], accepted.tolist(), equal_nan=True)
    assert peak < held / 3, f"{peak / 1e6:.1f} MB to pass over {held / 1e6:.1f} MB of records"


def test_the_records_digest_is_hashed_one_record_at_a_time(tmp_path: Path) -> None:
    """``records_digest`` is the sha256 of the JSON of every (prompt_id, sample, tokens) row in key order, as before,
    without building that JSON (or the rows' lists) whole: its peak is a few records' tokens."""
    import hashlib

    records = EvalContext.load(write_records(tmp_path / "run"), eval_cfg(), "cpu").records[::-1]
    rows = sorted(([r["prompt_id"], r["sample"], r["tokens"].tolist()] for r in records), key=lambda row: row[:2])
    expected = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    del rows
    tracemalloc.start()
    try:
        digest = records_digest(records)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == expected
    assert records_digest([]) == hashlib.sha256(b"[]").hexdigest()
    one = TOKENS * 40  # one record's tokens as a list of Python ints and their JSON, generously
    assert peak < 4 * one, f"{peak / 1e6:.1f} MB to hash {IMAGES} records"


COMMITTED = Path(__file__).resolve().parents[2] / "results" / "toy_paper" / "0_ar"


def broken_copy(tmp_path: Path, index: int, change) -> Path:
    """A copy of a committed toy run (records and run.json) whose record ``index`` is changed by ``change``."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    for name in ("run.json", "config.yaml"):
        (run / name).write_bytes((COMMITTED / name).read_bytes())
    lines = (COMMITTED / RECORDS_FILE).read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[index])
    change(record)
    lines[index] = json.dumps(record, separators=(",", ":"))
    (run / RECORDS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run


def set_token(record: dict) -> None:
    record["tokens"][17] = 99999


def cut_tokens(record: dict) -> None:
    record["tokens"] = record["tokens"][:-1]


def other_grid(record: dict) -> None:
    record["grid"] = [8, 32]


def cut_entropy(record: dict) -> None:
    record["entropy"] = record["entropy"][:100]


@pytest.mark.parametrize(("change", "says"), [
    (set_token, r"token 99999 at position 17 is not an id the model's bodies hold \(image codes 0-255\)"),
    (cut_tokens, r"255 tokens, but the model's bodies have 256"),
    (other_grid, r"grid \[8, 32\], but the model's is \[16, 16\]"),
    (cut_entropy, r"100 entropy values for 256 tokens"),
])
def test_a_record_the_model_cannot_have_made_is_refused_in_one_line(tmp_path: Path, change, says: str) -> None:
    """Before any metric runs, a record whose ids, length, grid or per-token fields do not fit the run's model is
    refused in one line naming the run's file and line, the image and the field."""
    from csd.errors import RecordsError

    run = broken_copy(tmp_path, 5, change)
    with pytest.raises(RecordsError, match=rf"records.jsonl:6: toy-0005 sample 0: {says}") as err:
        EvalContext.load(run, eval_cfg(), "cpu")
    assert "\n" not in str(err.value)
    assert len(EvalContext.load(broken_copy(tmp_path / "ok", 5, lambda r: None), eval_cfg(), "cpu").records) == 400
