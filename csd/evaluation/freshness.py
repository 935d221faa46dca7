"""Whether a run's ``metrics.json`` still describes its records: a run resumed, extended or repaired after it
was evaluated holds other records than its metrics (read by ``stage=report`` and ``stage=status``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from csd.errors import RecordsError
from csd.evaluation import PER_IMAGE_FILE
from csd.records import load_records, record_files, records_digest

#: states of :func:`metrics_state`
CURRENT, STALE, UNVERIFIED = "current", "stale", "unverified"


def refresh_hint(run_dir: Path) -> str:
    """The command that evaluates ``run_dir`` again."""
    return f"refresh with stage=evaluate run_dir={run_dir}"


def metrics_state(run_dir: Path, metrics: dict[str, Any]) -> tuple[str, str]:
    """``(state, message)`` of the ``metrics.json`` content ``metrics`` of ``run_dir``.

    ``current``: its ``run.records_sha256`` (:func:`csd.records.records_digest`) is the digest of the run's
    records. ``stale``: the records differ from the ones evaluated (another count, other images or tokens) or
    cannot be read. ``unverified``: metrics.json was written before it recorded the digest, and its
    ``n_records`` and the images of ``per_image.jsonl`` match the records; or the run has no records files.
    The message says why, and for stale metrics the command that refreshes them.
    """
    run = metrics.get("run") or {}
    refresh = refresh_hint(run_dir)
    if not record_files(run_dir):
        return UNVERIFIED, "no records files to check metrics.json against"
    try:
        records = load_records(run_dir, compact=True)
    except RecordsError as err:
        return STALE, f"metrics.json cannot be checked against unreadable records ({err}); then {refresh}"
    described, now = run.get("n_records"), len(records)
    if described != now:
        return STALE, f"metrics.json describes {described} records, the run now has {now}; {refresh}"
    digest = run.get("records_sha256")
    if digest is None:
        checked = "record count"
        keys = per_image_keys(run_dir)
        if keys is not None:
            if keys != {(r["prompt_id"], r["sample"]) for r in records}:
                return STALE, f"{PER_IMAGE_FILE} names other images than the run's records; {refresh}"
            checked += " and images"
        return UNVERIFIED, f"evaluated before metrics.json recorded a records digest; checked by {checked}"
    if digest != records_digest(records):
        return STALE, ("metrics.json describes other records than the run now holds (same count, other "
                       f"images or tokens); {refresh}")
    return CURRENT, f"metrics.json describes the run's {now} records"


def per_image_keys(run_dir: Path) -> set[tuple[str, int]] | None:
    """The (prompt_id, sample) of every row of ``per_image.jsonl``; None without a readable one."""
    try:
        lines = (run_dir / PER_IMAGE_FILE).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines]
        return {(row["prompt_id"], row["sample"]) for row in rows}
    except (OSError, ValueError, KeyError, TypeError):
        return None
