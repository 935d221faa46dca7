"""Run-directory integrity: fingerprinted resume, one writer at a time, corrupt lines and lost PNGs, Ctrl-C."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from csd.cli import run_stages
from csd.engine import JacobiEngine
from csd.errors import ConfigError, LockHeldError, RecordsError
from csd.evaluation.context import EvalContext
from csd.lockfile import FileLock
from csd.pipeline import generate_run
from csd.records import RECORDS_FILE, REJECTED_FILE, load_records
from csd.rundir import ADDED_KEYS, FINGERPRINT_FILE, LOCK_FILE, stored_fingerprint
from csd.status import status_table
from tests.evaluation.test_eval_fixtures import REPO, eval_cfg, make_run
from tests.pipeline.test_config import make_cfg

HOST = socket.gethostname()


def tiny_cfg(run_dir: Path, *overrides: str):
    """Janus-Pro tiny on the smoke captions: a few seconds per run on one CPU thread."""
    cfg = make_cfg(
        "model=janus_pro_tiny", "dataset=smoke", "dataset.n_prompts=3", "method=csd", "engine.progress=false",
        "engine.warmup=0", "logger=disabled", *overrides,
    )
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
    return cfg


def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("csd.compose.build_adapter", refuse)


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_resume_with_other_settings_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    generate_run(tiny_cfg(tmp_path))
    before = (tmp_path / RECORDS_FILE).read_bytes()
    no_model_load(monkeypatch)
    with pytest.raises(ConfigError, match=r"method\.lam: 0\.1 -> 0\.9"):
        generate_run(tiny_cfg(tmp_path, "method.lam=0.9"))
    with pytest.raises(ConfigError, match=r"method\._target_: 'csd\.acceptance\.CSD' -> 'csd\.acceptance\.SJD'.*method\.name: 'csd' -> 'sjd'"):
        generate_run(tiny_cfg(tmp_path, "method=sjd"))
    with pytest.raises(ConfigError, match=r"dataset\.n_prompts: 3 -> 2.*dataset\.prompts_sha256"):
        generate_run(tiny_cfg(tmp_path, "dataset.n_prompts=2"))
    with pytest.raises(ConfigError, match=r"seed: 0 -> 1"):
        generate_run(tiny_cfg(tmp_path, "seed=1"))
    assert (tmp_path / RECORDS_FILE).read_bytes() == before

    # settings that do not change the images may differ on resume
    cfg = tiny_cfg(tmp_path, "logger=wandb", "engine.progress=true", "engine.warmup=2", "eval.strict=true", "engine.max_cache_len=512")
    with open_dict(cfg):
        cfg.threads = 2
    generate_run(cfg)
    assert (tmp_path / RECORDS_FILE).read_bytes() == before


def test_older_run_directories_are_checked_against_their_config_yaml(tmp_path, monkeypatch):
    generate_run(tiny_cfg(tmp_path))
    (tmp_path / FINGERPRINT_FILE).unlink()
    no_model_load(monkeypatch)
    generate_run(tiny_cfg(tmp_path))  # same settings: accepted, and the fingerprint is written
    assert (tmp_path / FINGERPRINT_FILE).exists()
    (tmp_path / FINGERPRINT_FILE).unlink()
    with pytest.raises(ConfigError, match=r"method\.lam: 0\.1 -> 0\.2"):
        generate_run(tiny_cfg(tmp_path, "method.lam=0.2"))
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(ConfigError, match=r"has records but no fingerprint\.json or config\.yaml"):
        generate_run(tiny_cfg(tmp_path))


def test_a_second_writer_is_refused_with_the_holders_pid_and_host(tmp_path, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": holder.pid, "host": HOST, "time": "now"}))
        with pytest.raises(LockHeldError, match=rf"in use by pid {holder.pid} on host {HOST} \(lock {tmp_path / LOCK_FILE}"):
            generate_run(tiny_cfg(tmp_path))
        assert not (tmp_path / RECORDS_FILE).exists()
    finally:
        holder.communicate(b"")
    generate_run(tiny_cfg(tmp_path))  # the holder is gone: its lock is stale and taken over
    assert len(load_records(tmp_path)) == 3
    assert not (tmp_path / LOCK_FILE).exists()


def test_lock_is_exclusive_and_stale_locks_are_taken_over(tmp_path):
    path = tmp_path / "shard.lock"
    with FileLock(path), pytest.raises(LockHeldError, match=rf"pid \d+ on host {HOST}"):
        FileLock(path).acquire()
    assert not path.exists()

    path.write_text(json.dumps({"pid": dead_pid(), "host": HOST, "time": "then"}))
    with FileLock(path) as lock:
        assert json.loads(path.read_text())["pid"] == lock.owner["pid"]
    path.write_text("fresh")  # a lock taken between reading the stale one and removing it stays
    FileLock(path)._remove_if_unchanged(b"stale")
    assert path.read_text() == "fresh" and list(tmp_path.iterdir()) == [path]
    path.write_text(json.dumps({"pid": dead_pid(), "host": "other-node", "time": "then"}))
    with pytest.raises(LockHeldError, match="on host other-node .*delete"):  # cannot be checked from here
        FileLock(path).acquire()


def test_corrupt_line_is_named_then_set_aside_and_its_image_redone(tmp_path, capsys):
    cfg = tiny_cfg(tmp_path)
    generate_run(cfg)
    lines = (tmp_path / RECORDS_FILE).read_text().splitlines(keepends=True)
    (tmp_path / RECORDS_FILE).write_text(lines[0] + lines[1][:100] + "\n" + lines[2])
    with pytest.raises(RecordsError, match=rf"{tmp_path / RECORDS_FILE}:2: not a JSON record"):
        load_records(tmp_path)
    with pytest.raises(RecordsError, match=r"records\.jsonl:2: not a JSON record"):
        EvalContext.load(tmp_path, cfg.eval, "cpu")
    with open_dict(cfg):
        cfg.stage = "evaluate"
    with pytest.raises(SystemExit) as exit_info:
        run_stages(cfg)
    assert exit_info.value.code == 2 and "records.jsonl:2: not a JSON record" in capsys.readouterr().err

    generate_run(tiny_cfg(tmp_path))
    again = (tmp_path / RECORDS_FILE).read_text().splitlines(keepends=True)
    assert again[:2] == [lines[0], lines[2]]  # readable records kept as they were
    assert json.loads(again[2])["tokens"] == json.loads(lines[1])["tokens"]  # same seed -> same image
    rejected = [json.loads(line) for line in (tmp_path / REJECTED_FILE).read_text().splitlines()]
    assert [(r["line"], r["text"]) for r in rejected] == [(2, lines[1][:100] + "\n")]


def test_records_whose_png_is_missing_or_broken_are_kept(tmp_path, monkeypatch):
    """A record is its image (its tokens; csd.decode): a resume keeps it whatever happened to its PNG, and loads no
    model when every image is recorded."""
    generate_run(tiny_cfg(tmp_path))
    lines = (tmp_path / RECORDS_FILE).read_bytes()
    records = load_records(tmp_path)
    (tmp_path / records[0]["image"]).unlink()
    broken = tmp_path / records[2]["image"]
    broken.write_bytes(broken.read_bytes()[:60])
    no_model_load(monkeypatch)
    generate_run(tiny_cfg(tmp_path))
    assert (tmp_path / RECORDS_FILE).read_bytes() == lines
    assert not (tmp_path / REJECTED_FILE).exists()
    assert [r.done for r in status_table(tmp_path, 10)[1]] == [3]


def test_evaluate_refuses_records_that_run_json_does_not_describe(tmp_path):
    run = make_run(tmp_path / "r", method="csd", n_images=3, method_params={"lam": 0.1})
    cfg = eval_cfg(tmp_path)
    path = run / RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    changed = json.loads(lines[1])
    changed["method_params"]["lam"] = 0.9
    path.write_text(lines[0] + json.dumps(changed) + "\n" + lines[2])
    with pytest.raises(RecordsError, match=r"records\.jsonl:2: p001 sample 0 has method_params\.lam=0\.9 but run\.json says 0\.1"):
        EvalContext.load(run, cfg.eval, "cpu")
    path.write_text("".join(lines) + lines[0])
    with pytest.raises(RecordsError, match=r"records\.jsonl:4: second record of p000 sample 0 \(first on line 1\)"):
        EvalContext.load(run, cfg.eval, "cpu")


def test_ctrl_c_prints_what_was_saved_and_how_to_resume(tmp_path, monkeypatch, capsys):
    original = JacobiEngine.generate_many

    def interrupted_on_second_image(self, requests):
        results = original(self, requests)
        yield next(results)
        raise KeyboardInterrupt

    monkeypatch.setattr(JacobiEngine, "generate_many", interrupted_on_second_image)
    cfg = tiny_cfg(tmp_path, "stage=generate")
    stopped = None
    try:  # a KeyboardInterrupt escaping here would stop pytest itself, so catch everything
        run_stages(cfg)
    except BaseException as err:
        stopped = err
    assert isinstance(stopped, SystemExit) and stopped.code == 130
    assert capsys.readouterr().err == (  # the run was given run_dir=, so the message names run_dir= (not hydra.run.dir)
        f"interrupted: 1 of 3 images saved in {tmp_path}; to resume, run the same command with run_dir={tmp_path}\n"
    )
    assert len(load_records(tmp_path)) == 1 and not (tmp_path / LOCK_FILE).exists()
    monkeypatch.undo()
    generate_run(cfg)
    assert len(load_records(tmp_path)) == 3


def test_keys_added_later_take_their_implicit_value_where_the_config_has_them(tmp_path):
    """A fingerprint written before ``method.draft_record`` / ``dataset.caption_rule`` existed matches a config that
    sets their implicit values; a dataset without caption rules (toy, smoke) is not given one."""
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps({"sha256": "", "keys": {"seed": 0}}))
    coco = {"seed": 0, "method.draft_record": "onehot", "dataset.caption_rule": "longest"}
    assert stored_fingerprint(tmp_path, coco) == coco
    assert stored_fingerprint(tmp_path, {"seed": 0, "method.draft_record": "onehot"}) == {"seed": 0, "method.draft_record": "onehot"}
    assert stored_fingerprint(tmp_path, {"seed": 0, "dataset.caption_rule": "sjd"}) != {"seed": 0, "dataset.caption_rule": "sjd"}


def test_method_keys_with_a_default_are_known_to_older_fingerprints() -> None:
    """A method key added with a non-null default would make every older run directory refuse to resume (its
    fingerprint lacks the key): such keys must be in ADDED_KEYS with the value older runs used."""
    keys = OmegaConf.load(REPO / "conf" / "method_keys.yaml")
    fingerprinted_from_the_start = {"window", "init", "coupling"}
    defaulted = {k for k, v in keys.items() if v is not None} - fingerprinted_from_the_start
    assert {f"method.{k}" for k in defaulted} <= set(ADDED_KEYS)
    assert all(ADDED_KEYS[f"method.{k}"] == keys[k] for k in defaulted)


def test_run_made_before_the_tree_keys_resumes(tmp_path, monkeypatch):
    generate_run(tiny_cfg(tmp_path))
    path = tmp_path / FINGERPRINT_FILE
    stored = json.loads(path.read_text())
    for key in ("method.tree_width", "method.tree_depth", "method.pac_code_parity", "method.draft_record"):
        stored["keys"].pop(key)
    path.write_text(json.dumps(stored))
    no_model_load(monkeypatch)
    generate_run(tiny_cfg(tmp_path))  # nothing to do: accepted without loading the model


def test_run_made_before_lanterns_keys_were_renamed_resumes_and_reports(tmp_path, monkeypatch):
    """A LANTERN run recorded with ``k``/``delta`` (fingerprint, run.json, records) resumes without a new image and
    without setting a record aside, and the report reads its parameters under the current names."""
    cfg = tiny_cfg(tmp_path, "method=lantern", "method.neighbours=8", "dataset.n_prompts=2")
    generate_run(cfg)
    path = tmp_path / FINGERPRINT_FILE
    stored = json.loads(path.read_text())
    stored["keys"]["method.k"], stored["keys"]["method.delta"] = stored["keys"].pop("method.neighbours"), stored["keys"].pop("method.budget")
    path.write_text(json.dumps(stored))
    old = {"k": 8, "delta": 0.1}
    info = json.loads((tmp_path / "run.json").read_text())
    info["method_params"] = {**{k: v for k, v in info["method_params"].items() if k not in ("neighbours", "budget")}, **old}
    (tmp_path / "run.json").write_text(json.dumps(info))
    lines = [json.loads(line) for line in (tmp_path / RECORDS_FILE).read_text().splitlines()]
    for record in lines:
        record["method_params"] = info["method_params"]
    (tmp_path / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))
    no_model_load(monkeypatch)
    generate_run(tiny_cfg(tmp_path, "method=lantern", "method.neighbours=8", "dataset.n_prompts=2"))  # nothing to do
    assert not (tmp_path / REJECTED_FILE).exists() and len(load_records(tmp_path)) == 2
    from csd.report.collect import run_params

    assert run_params(info)["neighbours"] == 8 and run_params(info)["budget"] == 0.1
