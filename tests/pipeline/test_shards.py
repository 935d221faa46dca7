"""Scale-out: shards of one run directory, the local_procs / slurm_gpu launcher presets, merge at evaluate,
stage=status, and a killed shard resuming."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from csd.cli import interrupted_message, one_gpu_per_shard
from csd.compose import load_prompts
from csd.errors import ConfigError, LockHeldError
from csd.evaluate import evaluate_run
from csd.pipeline import generate_run
from csd.presets import CONF_DIR
from csd.records import RECORDS_FILE, load_records, record_files
from csd.rundir import RunLock, check_fingerprint, shard_of
from csd.status import status_table
from tests.pipeline.test_config import ROOT
from tests.pipeline.test_rundir import dead_pid, no_model_load, tiny_cfg

#: janus_pro_tiny on all 6 smoke captions, 2 samples each: 12 images, split 10 / 2 over 2 shards
RUN = ["model=janus_pro_tiny", "dataset=smoke", "dataset.n_prompts=6", "dataset.samples_per_prompt=2", "method=csd",
       "engine.progress=false", "engine.warmup=0", "logger=disabled", "eval.metrics=[speed,content]"]
#: record fields that are timings (differ between any two runs)
TIMINGS = ("prefill_s", "decode_s", "drafter_s", "vq_decode_s", "latency_s")


def cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def shard_cfg(run_dir: Path, shard: int, *overrides: str):
    return tiny_cfg(run_dir, *RUN[5:], "dataset.n_prompts=6", "dataset.samples_per_prompt=2", "dataset.num_shards=2",
                    f"dataset.shard={shard}", *overrides)


def without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


def deterministic(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not any(t in k for t in (*TIMINGS, "latency", "throughput"))}


def test_shard_membership_is_a_hash_of_the_prompt_id():
    ids = [f"p{i}" for i in range(200)]
    assert [shard_of(i, 4) for i in ids] == [shard_of(i, 4) for i in reversed(ids)][::-1]  # not rank order
    assert {shard_of(i, 4) for i in ids} == {0, 1, 2, 3}
    assert all(shard_of(i, 1) == 0 for i in ids)


@pytest.mark.slow
def test_two_shards_through_local_procs_equal_a_one_process_run(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    proc = cli("-m", *RUN, "stage=generate", "dataset.num_shards=2", "dataset.shard=0,1", "hydra/launcher=local_procs",
               f"run_dir={two}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    cfg = tiny_cfg(one, *RUN[5:], "dataset.n_prompts=6", "dataset.samples_per_prompt=2")
    generate_run(cfg)  # the one-process run, while the shards run
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert sorted(p.name for p in record_files(two)) == ["records.shard-000-of-002.jsonl", "records.shard-001-of-002.jsonl"]
    for path in record_files(two):  # each shard wrote only its prompts
        shard = int(path.name.split("-")[1])
        assert {shard_of(json.loads(line)["prompt_id"], 2) for line in path.read_text().splitlines()} == {shard}
    merged, single = load_records(two), load_records(one)
    assert len(merged) == len({(r["prompt_id"], r["sample"]) for r in merged}) == 12  # no duplicates, no gaps
    assert without_timings(merged) == without_timings(single)
    for r in single:
        assert (two / r["image"]).read_bytes() == (one / r["image"]).read_bytes()
    assert json.loads((two / "run.json").read_text())["n_images"] == 12
    with open_dict(cfg):
        cfg.run_dir = str(two)
    sharded = evaluate_run(two, cfg)
    plain = evaluate_run(one, cfg)
    assert deterministic(sharded["metrics"]) == deterministic(plain["metrics"]) and "step_compression" in plain["metrics"]
    assert json.dumps(sharded["content"]) == json.dumps(plain["content"])  # NaN bins compare equal as text
    assert sharded["metrics"]["throughput_images_per_s"] > 0  # merged from the shards' run.shard-*.json
    assert "allow_partial" not in sharded["run"]


@pytest.mark.slow
def test_killed_shard_is_dead_in_status_refused_by_evaluate_and_completes_on_rerun(tmp_path, capsys):
    run = tmp_path / "run"
    generate_run(shard_cfg(run, 1))  # the small shard, complete
    proc = cli(*RUN, "stage=generate", "dataset.num_shards=2", "dataset.shard=0", f"run_dir={run}")
    records = run / "records.shard-000-of-002.jsonl"
    deadline = time.monotonic() + 120
    while not (records.exists() and records.read_bytes().count(b"\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    done = records.read_bytes().count(b"\n")
    assert 1 <= done < 10, "shard 0 was not killed mid-way"
    table, rows = status_table(tmp_path, stale_min=10)
    state = {r.shard: (r.done, r.total, r.state) for r in rows}
    assert state == {records.name: (done, 10, "dead"), "records.shard-001-of-002.jsonl": (2, 2, "complete")}
    assert f"{done + 2}/12 images" in table
    cfg = shard_cfg(run, 0)
    with pytest.raises(ConfigError, match=rf"records\.shard-000-of-002\.jsonl lacks {10 - done} of 10.*eval\.allow_partial=true"):
        evaluate_run(run, cfg)
    with open_dict(cfg):
        cfg.eval.allow_partial = True
    partial = evaluate_run(run, cfg)
    assert partial["run"]["allow_partial"] is True and partial["run"]["missing"] == {records.name: 10 - done}
    generate_run(shard_cfg(run, 0))  # rerun only the killed shard: takes over its lock, resumes
    rows = status_table(run, stale_min=10)[1]
    assert [(r.done, r.total, r.state) for r in rows] == [(10, 10, "complete"), (2, 2, "complete")]
    keys = [(r["prompt_id"], r["sample"]) for r in load_records(run)]
    assert len(keys) == len(set(keys)) == 12
    with open_dict(cfg):
        cfg.eval.allow_partial = False
    assert evaluate_run(run, cfg)["run"]["n_records"] == 12


@pytest.mark.slow
def test_status_cli_over_a_sweep_dir(tmp_path):
    generate_run(shard_cfg(tmp_path / "a" / "run", 1))
    proc = cli("stage=status", f"sweep_dir={tmp_path / 'a'}", "logger=disabled")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    assert "2/12 images, 1/2 shards complete" in out and "stopped" in out and "complete" in out
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["run"]  # Hydra's files go to runs/status/<time>


def test_a_shard_with_another_lam_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    cfg0 = shard_cfg(tmp_path, 0)
    check_fingerprint(tmp_path, cfg0, load_prompts(cfg0.dataset))  # shard 0 started, still loading its model
    no_model_load(monkeypatch)
    with pytest.raises(ConfigError, match=r"method\.lam: 0\.1 -> 0\.9"):
        generate_run(shard_cfg(tmp_path, 1, "method.lam=0.9"))
    assert not record_files(tmp_path)


def test_another_shard_count_is_refused(tmp_path, monkeypatch):
    generate_run(shard_cfg(tmp_path, 1))
    no_model_load(monkeypatch)
    with pytest.raises(ConfigError, match=r"dataset\.num_shards=3, but .* is split into 2 shards"):
        generate_run(shard_cfg(tmp_path, 0, "dataset.num_shards=3"))
    with pytest.raises(ConfigError, match=r"dataset\.shard=2 must be < dataset\.num_shards=2"):
        generate_run(shard_cfg(tmp_path, 2))


def test_unsharded_runs_keep_their_file_names(tmp_path):
    generate_run(tiny_cfg(tmp_path))
    assert [p.name for p in record_files(tmp_path)] == [RECORDS_FILE]
    assert not list(tmp_path.glob("run.shard-*"))


def test_a_requeued_slurm_job_takes_over_its_own_lock(tmp_path, monkeypatch):
    lock = tmp_path / ".lock.shard-000-of-002"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    lock.write_text(json.dumps({"pid": dead_pid(), "host": "other-node", "slurm_job_id": "4242"}))
    with RunLock(lock) as held:  # the previous instance of this job, killed on another node
        assert json.loads(lock.read_text())["slurm_job_id"] == "4242" and held.owner["host"] == socket.gethostname()
    lock.write_text(json.dumps({"pid": 1, "host": "other-node", "slurm_job_id": "999"}))
    with pytest.raises(LockHeldError, match="other-node"):
        RunLock(lock).acquire()


def test_each_local_shard_sees_one_gpu(monkeypatch):
    cfg = tiny_cfg(Path("unused"), "dataset.num_shards=8", "dataset.shard=5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    one_gpu_per_shard(cfg)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # SLURM gave the job its GPU
    one_gpu_per_shard(cfg)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_the_launcher_presets_compose_without_slurm():
    from hydra.utils import get_class
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

    for preset, conf in (("slurm_gpu", SlurmQueueConf), ("local_procs", LocalQueueConf)):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", [f"hydra/launcher={preset}", "hydra.launcher.timeout_min=30"], return_hydra_config=True)
        launcher = cfg.hydra.launcher
        assert launcher.timeout_min == 30 and set(launcher) <= set(conf.__dataclass_fields__)
        bases = {f"{c.__module__}.{c.__qualname__}" for c in get_class(launcher._target_).__mro__}
        assert conf._target_ in bases  # the plugin's launcher, with one line per failed job
    assert (launcher.gpus_per_node, launcher.tasks_per_node) == (0, 1)  # local_procs: CPU unless told
    preset = (CONF_DIR / "hydra" / "launcher" / "slurm_gpu.yaml").read_text()
    for key in ("gpus_per_node", "tasks_per_node", "cpus_per_task", "mem_gb", "timeout_min", "partition",
                "array_parallelism", "additional_parameters"):
        assert f"\n{key}:" in preset


def test_ctrl_c_names_the_directory_key_the_run_was_given(tmp_path):
    cfg = OmegaConf.create({"stage": "generate", "run_dir": str(tmp_path), "dataset": {"num_shards": 1}})
    for key in ("run_dir", "hydra.run.dir"):
        assert interrupted_message(cfg, "", multirun=False, run_key=key) == (
            f"finished images are kept in {tmp_path}; to resume, run the same command with {key}={tmp_path}")


def test_ctrl_c_in_a_shard_says_how_to_resume_that_shard(tmp_path):
    cfg = OmegaConf.create({"stage": "generate", "run_dir": str(tmp_path), "dataset": {"num_shards": 4, "shard": 2}})
    assert interrupted_message(cfg, "3 of 9 images saved in x") == (
        f"3 of 9 images saved in x; to resume this shard, run it alone with run_dir={tmp_path} "
        "dataset.num_shards=4 dataset.shard=2"
    )



class FakeJob:
    """What failure_line reads of a submitit job: its stderr text, state and log path."""

    def __init__(self, stderr: str, state: str = "CANCELLED") -> None:
        self.text, self.state = stderr, state
        self.paths = type("Paths", (), {"stderr": Path("/sweep/.submitit/7/7_0_log.err")})()

    def stderr(self) -> str:
        return self.text


def test_a_failed_shard_job_is_one_line_naming_it_and_how_to_rerun_it(tmp_path):
    from submitit.core.utils import FailedJobError, UncompletedJobError

    from hydra_plugins.csd_launcher.launcher import failure_line

    cfg = OmegaConf.create({"stage": "generate", "run_dir": str(tmp_path), "dataset": {"num_shards": 4, "shard": 2}})
    overrides = ["dataset.num_shards=4", "dataset.shard=2", "hydra.launcher.timeout_min=30"]
    name, log = "job #2 (dataset.num_shards=4 dataset.shard=2)", "its log: /sweep/.submitit/7/7_0_log.err"
    rerun = f"run it alone with run_dir={tmp_path} dataset.num_shards=4 dataset.shard=2"
    killed = FakeJob("[2026-01-01 10:00:00][csd.pipeline][INFO] - 9 of 9 images to generate\n")
    assert failure_line(2, overrides, cfg, killed, UncompletedJobError("no output")) == (
        f"{name} ended without a result (its job state: CANCELLED): finished images are kept in {tmp_path}; "
        f"to resume this shard, {rerun}; {log}")
    crashed = FakeJob("Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    assert failure_line(2, overrides, cfg, crashed, FailedJobError("trace")).startswith(
        f"{name} failed (torch.OutOfMemoryError: CUDA out of memory.): finished images are kept in {tmp_path}")
    stopped = FakeJob(f"interrupted: 3 of 9 images saved in {tmp_path}; to resume this shard, {rerun}\n")
    assert failure_line(2, overrides, cfg, stopped, FailedJobError("trace")) == (
        f"{name} was interrupted: 3 of 9 images saved in {tmp_path}; to resume this shard, {rerun}; {log}")
    refused = FakeJob("error: method.lam=-1 must be >= 0\n")
    assert failure_line(2, overrides, cfg, refused, UncompletedJobError("x")) == (
        f"{name} failed: method.lam=-1 must be >= 0; {log}")


@pytest.mark.slow
def test_killing_a_local_shard_ends_the_sweep_with_one_line_not_a_traceback(tmp_path):
    run = tmp_path / "run"
    proc = cli("-m", *RUN, "stage=generate", "dataset.num_shards=2", "dataset.shard=0,1", "hydra/launcher=local_procs",
               f"run_dir={run}", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    lock = run / ".lock.shard-000-of-002"
    deadline = time.monotonic() + 120
    while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(json.loads(lock.read_text())["pid"], signal.SIGKILL)  # the shard's own process, as a node failure would
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: job #0 (") and "dataset.shard=0 " in errors[0]
    assert errors[0].endswith("_0_log.err") and (
        f"to resume this shard, run it alone with run_dir={run} dataset.num_shards=2 dataset.shard=0; " in errors[0])
