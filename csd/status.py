"""``stage=status``: progress of a run or of every run under a sweep directory, per shard.

A shard is ``complete`` (every image it owes has a usable record, counted as a resume counts them:
:func:`csd.rundir.shard_progress`), ``running`` (its lock is held and it wrote within
``status.stale_min`` minutes), ``dead`` (incomplete, and its lock names a process gone from this host or
nothing was written for ``status.stale_min`` minutes) or ``stopped`` (incomplete, no lock: never started or
ended). Rerun a dead or stopped shard with the same command (it resumes; a dead holder's lock is taken over).
Each run's line also says whether its ``metrics.json`` still describes its records (:func:`metrics_note`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from csd.evaluation import METRICS_FILE
from csd.evaluation.freshness import CURRENT, metrics_state, refresh_hint
from csd.lockfile import lock_holder
from csd.records import RECORDS_FILE
from csd.rundir import FINGERPRINT_FILE, LOCK_FILE, shard_progress


@dataclass
class ShardStatus:
    """One records file of a run: images done / owed, the last write (epoch seconds, 0 = never), state."""

    run_dir: Path
    shard: str
    done: int
    total: int
    last_write: float
    state: str


def shard_status(run_dir: Path, stale_min: float, now: float | None = None) -> list[ShardStatus]:
    """Every shard of ``run_dir`` (an unsharded run is one shard, ``records.jsonl``)."""
    now = time.time() if now is None else now
    info = run_dir / "run.json"
    out = []
    progress = shard_progress(run_dir, json.loads(info.read_text()) if info.exists() else {})
    for name, (done, total) in progress.items():
        suffix = "" if name == RECORDS_FILE else "." + name.removeprefix("records.").removesuffix(".jsonl")
        lock = run_dir / f"{LOCK_FILE}{suffix}"
        last = max((p.stat().st_mtime for p in (run_dir / name, lock) if p.exists()), default=0.0)
        if done >= total:
            state = "complete"
        elif not lock.exists():
            state = "stopped"
        elif lock_holder(lock) is None or now - last > 60 * stale_min:
            state = "dead"
        else:
            state = "running"
        out.append(ShardStatus(run_dir, name, done, total, last, state))
    return out


def metrics_note(run_dir: Path) -> str:
    """``not evaluated``, ``metrics current``, or ``metrics stale`` / ``unverified`` / ``unreadable`` with why
    (:func:`csd.evaluation.freshness.metrics_state`)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return "not evaluated"
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        return f"metrics unreadable: {path} is not valid JSON ({err}); {refresh_hint(run_dir)}"
    state, message = metrics_state(run_dir, metrics)
    return f"metrics {state}" if state == CURRENT else f"metrics {state}: {message}"


def run_dirs(path: Path) -> list[Path]:
    """``path`` if it is a run directory, else every run directory below it (those with a fingerprint)."""
    if (path / FINGERPRINT_FILE).exists():
        return [path]
    return sorted(p.parent for p in path.rglob(FINGERPRINT_FILE))


def status_table(path: Path, stale_min: float) -> tuple[str, list[ShardStatus]]:
    """A text table (per run: images done / owed and the state of its metrics, then one line per shard) and
    the rows behind it."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory; give a run_dir or sweep_dir")
    rows, lines = [], []
    for run in run_dirs(path):
        shards = shard_status(run, stale_min)
        rows += shards
        done, total = sum(s.done for s in shards), sum(s.total for s in shards)
        complete = sum(s.state == "complete" for s in shards)
        lines.append(
            f"{run}: {done}/{total} images, {complete}/{len(shards)} shards complete; {metrics_note(run)}"
        )
        for s in shards:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.last_write)) if s.last_write else "never"
            lines.append(f"  {s.shard:40s} {s.done:6d}/{s.total:<6d} {s.state:9s} last write {when}")
    if not rows:
        lines.append(f"no run directories (with {FINGERPRINT_FILE}) under {path}")
    return "\n".join(lines), rows
