"""Run-directory integrity after generation: partial and in-progress runs at evaluate, metrics that no longer
describe the records, broken files, directories that do not exist, and records that resume and evaluate treat
alike."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import pytest
from omegaconf import open_dict

from csd.cli import run_stages
from csd.errors import ConfigError, RecordsError
from csd.evaluate import evaluate_run
from csd.evaluation import METRICS_FILE
from csd.evaluation.context import EvalContext
from csd.evaluation.freshness import metrics_state
from csd.pipeline import generate_run
from csd.records import RECORDS_FILE, REJECTED_FILE, RecordWriter, load_records, records_digest
from csd.report import build_report
from csd.report.collect import load_run
from csd.rundir import LOCK_FILE
from csd.status import status_table
from tests.evaluation.test_eval_fixtures import REPO, eval_cfg, make_run
from tests.pipeline.test_config import make_cfg, run_cli
from tests.pipeline.test_rundir import dead_pid, tiny_cfg

#: metrics that read only the records (no images, no CLIP model): fast
FAST = {"eval.toy.metrics": ["speed", "content"]}


def owe(run: Path, n_images: int) -> None:
    """Make ``run.json`` say the run owes ``n_images`` (as a run killed before the last ones were made)."""
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "n_images": n_images}))


def cut_after(run: Path, n: int) -> list[str]:
    """Keep the first ``n`` record lines (a run killed after ``n`` images); return every line as it was."""
    path = run / RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:n]))
    return lines


def stage_cfg(stage: str, tmp_path: Path, **keys: str):
    """The full config of ``run_stages`` for ``stage``, ``keys`` (run_dir, sweep_dir) set; fast metrics."""
    cfg = make_cfg(f"stage={stage}", "logger=disabled", "eval.toy.metrics=[speed,content]",
                   f"eval.fid.cache_dir={tmp_path / 'cache'}")
    with open_dict(cfg):
        for key, value in keys.items():
            cfg[key] = value
    return cfg


def exit_line(cfg, capsys: pytest.CaptureFixture) -> str:
    """``run_stages(cfg)``'s one error line (it must exit with status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        run_stages(cfg)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


# -- partial and in-progress runs are refused by evaluate ----------------------------------------------------


def test_evaluate_refuses_an_unsharded_run_with_missing_images(tmp_path):
    run = make_run(tmp_path / "r", "csd", n_images=2)
    owe(run, 8)
    cfg = eval_cfg(tmp_path, **FAST)
    incomplete = r"r is incomplete \(records\.jsonl has 2 of 8 images\).*eval\.allow_partial=true"
    with pytest.raises(ConfigError, match=incomplete):
        evaluate_run(run, cfg)
    assert not (run / METRICS_FILE).exists()
    cfg.eval.allow_partial = True
    partial = evaluate_run(run, cfg)
    assert partial["run"]["n_records"] == 2
    assert partial["run"]["allow_partial"] is True and partial["run"]["missing"] == {RECORDS_FILE: 6}


def test_evaluate_refuses_a_run_a_live_process_generates_into(tmp_path, capsys):
    run = make_run(tmp_path / "r", "csd", n_images=2)
    lock = run / LOCK_FILE
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": "now"}))
    cfg = eval_cfg(tmp_path, **FAST)
    holder = rf"pid {os.getpid()} on host .* is generating into it \(lock {lock}"
    with pytest.raises(ConfigError, match=holder):
        evaluate_run(run, cfg)
    assert "eval.allow_partial=true" in exit_line(stage_cfg("evaluate", tmp_path, run_dir=str(run)), capsys)
    shard_lock = run / f"{LOCK_FILE}.shard-001-of-002"
    lock.rename(shard_lock)
    with pytest.raises(ConfigError, match="is generating into it"):
        evaluate_run(run, cfg)
    crashed = {"pid": dead_pid(), "host": socket.gethostname(), "time": "then"}
    shard_lock.write_text(json.dumps(crashed))  # a lock left by a killed generator
    assert evaluate_run(run, cfg)["run"]["n_records"] == 2
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": "now"}))
    cfg.eval.allow_partial = True  # the images recorded so far, on purpose
    assert evaluate_run(run, cfg)["run"]["allow_partial"] is True


# -- metrics say which records they describe; report and status flag those that no longer match --------------


def test_report_and_status_flag_metrics_of_records_that_changed(tmp_path, caplog):
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_ar", "ar")
    run = make_run(sweep / "1_csd", "csd", n_images=3, method_params={"lam": 0.1})
    (run / "fingerprint.json").write_text("{}")  # status finds run directories by their fingerprint
    lines = cut_after(run, 2)  # killed after 2 of 3 images
    cfg = eval_cfg(tmp_path, **FAST)
    evaluate_run(sweep / "0_ar", cfg)
    cfg.eval.allow_partial = True
    evaluate_run(run, cfg)
    metrics = json.loads((run / METRICS_FILE).read_text())
    assert metrics["run"]["records_sha256"] == records_digest(load_records(run))
    assert metrics_state(run, metrics)[0] == "current"
    assert "metrics current" in status_table(run, 10)[0]

    (run / RECORDS_FILE).write_text("".join(lines))  # resumed to completion; metrics.json is the 2-image one
    refresh = f"stage=evaluate run_dir={run}"
    state, message = metrics_state(run, metrics)
    assert state == "stale" and refresh in message
    assert "metrics.json describes 2 records, the run now has 3" in message
    assert "metrics stale" in status_table(run, 10)[0] and refresh in status_table(run, 10)[0]
    with caplog.at_level(logging.WARNING):
        assert load_run(run) is None
        report = build_report(sweep, cfg)
    assert f"{run}: metrics.json describes 2 records" in caplog.text and refresh in caplog.text
    assert "1_csd" not in (report / "runs.csv").read_text()

    evaluate_run(run, cfg)
    changed = json.loads(lines[1])
    changed["tokens"][0] += 1  # same images counted, other tokens
    (run / RECORDS_FILE).write_text(lines[0] + json.dumps(changed) + "\n" + lines[2])
    state, message = metrics_state(run, json.loads((run / METRICS_FILE).read_text()))
    assert state == "stale" and "other records than the run now holds" in message


def test_metrics_without_a_digest_are_checked_by_count_and_images(tmp_path):
    run = make_run(tmp_path / "r", "csd", n_images=3)
    evaluate_run(run, eval_cfg(tmp_path, **FAST))
    metrics = json.loads((run / METRICS_FILE).read_text())
    del metrics["run"]["records_sha256"]  # evaluated before metrics.json recorded its records
    (run / METRICS_FILE).write_text(json.dumps(metrics))
    state, message = metrics_state(run, metrics)
    assert state == "unverified" and "before metrics.json recorded a records digest" in message
    assert load_run(run) is not None
    cut_after(run, 2)
    assert metrics_state(run, metrics)[0] == "stale"
    assert load_run(run) is None


@pytest.mark.parametrize("run", ["toy_paper/9_csd", "ablation_lambda_delta/0_csd"])
def test_committed_results_are_reported_and_left_as_they_are(run):
    path = REPO / "results" / run
    before = {p: p.stat().st_mtime_ns for p in path.iterdir()}
    result = load_run(path)
    assert result is not None and metrics_state(path, result)[0] == "unverified"
    assert {p: p.stat().st_mtime_ns for p in path.iterdir()} == before


# -- broken files: one line naming the file and the fix ------------------------------------------------------


def test_a_truncated_metrics_json_is_named_with_the_fix(tmp_path, caplog, capsys):
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_ar", "ar")
    run = make_run(sweep / "1_csd", "csd")
    cfg = eval_cfg(tmp_path, **FAST)
    for r in (sweep / "0_ar", run):
        evaluate_run(r, cfg)
    text = (run / METRICS_FILE).read_text()
    (run / METRICS_FILE).write_text(text[: len(text) // 2])
    with caplog.at_level(logging.WARNING):
        build_report(sweep, cfg)
    assert f"{run / METRICS_FILE} is not valid JSON" in caplog.text
    assert f"stage=evaluate run_dir={run}" in caplog.text
    err = exit_line(stage_cfg("report", tmp_path, run_dir=str(run), sweep_dir=str(run)), capsys)
    assert "no usable metrics.json" in err and "left out" in err


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_evaluate_needs_no_png_and_names_an_image_it_cannot_decode(tmp_path, capsys, monkeypatch, damage):
    from csd.toy.domain import toy_prompts

    # toy scenes, but 4 x 4 made-up tokens: not an image of the toy model
    run = make_run(tmp_path / "r", "csd", n_images=3, metas=[p.meta for p in toy_prompts(3, split="heldout")])
    png = run / load_records(run)[1]["image"]
    if damage == "truncated":
        png.write_bytes(png.read_bytes()[:60])
    else:
        png.unlink()
    load = "csd.decode.load_run_adapter"
    with monkeypatch.context() as patch:
        patch.setattr(load, lambda *a, **k: pytest.fail("metrics of the records alone decoded an image"))
        run_stages(stage_cfg("evaluate", tmp_path, run_dir=str(run)))
    assert (run / METRICS_FILE).exists()
    cfg = stage_cfg("evaluate", tmp_path, run_dir=str(run))
    cfg.eval.toy.metrics = ["speed", "scene"]  # reads every image: p001's is decoded from its record
    with pytest.raises(SystemExit) as exit_info:
        run_stages(cfg)
    last = capsys.readouterr().err.strip().split("\r")[-1]  # after the scene checker's progress bar
    assert exit_info.value.code == 2 and last.startswith("error: ") and len(last.splitlines()) == 1
    assert "p001 sample 0 has 16 tokens, but the run's model (ToyAdapter) decodes images of 256" in last


# -- directories that do not exist are named, and nothing is created -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), [
    (["stage=evaluate", "run_dir=gone"], "run_dir=gone does not exist"),
    (["stage=evaluate", "run_dir=empty"], "run_dir=empty is not a generated run directory (no run.json)"),
    (["stage=report", "sweep_dir=gone"], "sweep_dir=gone does not exist"),
    (["stage=status", "run_dir=gone"], "run_dir=gone does not exist"),
    (["stage=evaluate"], "stage=evaluate needs run_dir="),
    (["stage=report"], "stage=report needs sweep_dir="),
    (["stage=status"], "stage=status needs sweep_dir=<dir> or run_dir=<dir>"),
    (["stage=generate", "run_dir=afile"], "run_dir=afile is a file"),
])
def test_cli_names_a_missing_directory_and_creates_nothing(tmp_path, args, message):
    (tmp_path / "afile").write_text("")
    (tmp_path / "empty").mkdir()
    out = run_cli(*args, "logger=disabled", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith(f"error: {message}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "empty"]
    assert not any((tmp_path / "empty").iterdir())


# -- status counts the records a resume keeps; resume and evaluate agree on records of other settings --------


def test_status_counts_the_records_a_resume_keeps(tmp_path):
    generate_run(tiny_cfg(tmp_path))
    path = tmp_path / RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0][:80] + "\n" + lines[1] + lines[2])  # a corrupt line
    (tmp_path / json.loads(lines[2])["image"]).unlink()  # a deleted PNG: its record is still the image
    table, rows = status_table(tmp_path, stale_min=10)
    assert [(r.done, r.total, r.state) for r in rows] == [(2, 3, "stopped")]
    assert "2/3 images" in table
    assert len(RecordWriter(tmp_path).done) == 2  # what the resume keeps


def test_resume_and_evaluate_treat_a_record_of_other_settings_alike(tmp_path):
    cfg = tiny_cfg(tmp_path)
    generate_run(cfg)
    path = tmp_path / RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    foreign = json.loads(lines[1])
    foreign["method_params"]["lam"] = 0.9
    path.write_text(lines[0] + json.dumps(foreign) + "\n" + lines[2])
    foreign_line = r"records\.jsonl:2: smoke-001 sample 0 has method_params\.lam=0\.9 but run\.json says 0\.1"
    with pytest.raises(RecordsError, match=foreign_line + ".*resume the run"):
        EvalContext.load(tmp_path, cfg.eval, "cpu")
    assert [r.done for r in status_table(tmp_path, 10)[1]] == [2]
    generate_run(cfg)  # the resume sets it aside and makes the image again
    rejected = [json.loads(line) for line in (tmp_path / REJECTED_FILE).read_text().splitlines()]
    assert [(r["line"], "other settings" in r["reason"]) for r in rejected] == [(2, True)]
    again = load_records(tmp_path)
    assert again[1]["tokens"] == foreign["tokens"] and again[1]["method_params"]["lam"] == 0.1
    assert len(EvalContext.load(tmp_path, cfg.eval, "cpu").records) == 3


def test_records_from_before_a_method_key_existed_are_kept_by_resume_and_evaluate(tmp_path):
    cfg = tiny_cfg(tmp_path)
    generate_run(cfg)
    path = tmp_path / RECORDS_FILE
    old = [json.loads(line) for line in path.read_text().splitlines()]
    for record in old:
        del record["method_params"]["draft_record"]  # its implicit value, onehot, in run.json
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert len(EvalContext.load(tmp_path, cfg.eval, "cpu").records) == 3
    assert len(RecordWriter(tmp_path, expected=json.loads((tmp_path / "run.json").read_text())).done) == 3
    assert not (tmp_path / REJECTED_FILE).exists()
