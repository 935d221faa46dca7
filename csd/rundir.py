"""Run-directory integrity: the fingerprint of what determines the images, and the generate-stage lock.

``fingerprint.json`` holds a flat dict of dotted config keys (every ``method.*`` and ``model.*`` key,
``dataset.*`` but the evaluation-only ones, a sha256 of the prompt list, ``seed``, the device type,
``engine.compile``; null values left out) and their hash. Keys that do not change the images (logger,
progress bar, warm-up, cache length, batch size, latency probe, eval settings, threads) are left out, so
a resume may change them. So are ``dataset.num_shards`` / ``dataset.shard``: every shard of a run shares
one fingerprint, and ``shards.json`` records the run's shard count and the images each shard owes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from csd.compose import build_drafter, load_prompts
from csd.device import resolve_device
from csd.errors import ConfigError
from csd.lockfile import FileLock, lock_holder
from csd.prompts import Prompt
from csd.records import (
    IMPLICIT_METHOD_PARAMS,
    RECORDS_FILE,
    SETTINGS_FIELDS,
    record_files,
    records_file,
    shard_suffix,
    usable_lines,
)

FINGERPRINT_FILE = "fingerprint.json"
SHARDS_FILE = "shards.json"
LOCK_FILE = ".lock"
#: dataset keys that do not change the images: read only by the evaluate stage, or which part a process makes
DATASET_EVAL_KEYS = ("fid_reference", "num_shards", "shard")
#: the keys a longer prompt list changes (a resume may extend the list, never change or shorten it)
PROMPT_LIST_KEYS = ("dataset.n_prompts", "dataset.prompt_count", "dataset.prompts_sha256")


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _flatten(sub, f"{prefix}.{key}").items()}
    return {prefix: value}


def prompts_sha256(prompts: list[Prompt]) -> str:
    return hashlib.sha256(json.dumps([[p.prompt_id, p.text] for p in prompts]).encode()).hexdigest()


def device_type(device: str) -> str:
    """``cpu`` or ``cuda``: the kind of device changes the numerics, which GPU does not (and may be busy)."""
    return resolve_device(device).type if device == "auto" else str(device).split(":")[0]


def fingerprint(cfg: DictConfig, prompts: list[Prompt]) -> dict[str, Any]:
    """Dotted key -> value of everything that determines the generated images (JSON-normalised)."""
    dataset = {k: v for k, v in OmegaConf.to_container(cfg.dataset, resolve=True).items() if k not in DATASET_EVAL_KEYS}
    method = OmegaConf.to_container(cfg.method, resolve=True)
    if "drafter" in cfg:  # the drafting settings under the method keys runs recorded them by before the drafter group
        method.update({**IMPLICIT_METHOD_PARAMS, **build_drafter(cfg.drafter).params()})
    keys = {
        **_flatten(method, "method"),
        **_flatten(OmegaConf.to_container(cfg.model, resolve=True), "model"),
        **_flatten(dataset, "dataset"),
        "dataset.prompt_count": len(prompts),
        "dataset.prompts_sha256": prompts_sha256(prompts),
        "seed": cfg.seed,
        "device": device_type(cfg.device),
        "engine.compile": cfg.engine.compile,
    }
    # null = unset: a key added to the configs later (null by default) leaves older fingerprints valid
    return json.loads(json.dumps({k: v for k, v in keys.items() if v is not None}))


def _digest(keys: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()


#: keys added to the configs after runs were made, with the value those runs used without naming it
#: (``dataset.caption_rule``: COCO configs only, the loader's one rule before the option; the tree keys: chain windows)
ADDED_KEYS = {
    **{f"method.{k}": v for k, v in IMPLICIT_METHOD_PARAMS.items()}, "dataset.caption_rule": "longest",
}


def current_fingerprint_names(keys: dict[str, Any]) -> dict[str, Any]:
    """A stored fingerprint with the rule's renamed parameters (``method.<old>``) under their current names."""
    target = keys.get("method._target_")
    try:
        renamed = get_class(target).renamed if target else {}
    except (ImportError, AttributeError):  # a rule of one's own that is not importable here: nothing to rename
        renamed = {}
    return {f"method.{renamed.get(k[7:], k[7:])}" if k.startswith("method.") else k: v for k, v in keys.items()}


#: how to recover each JSON file of a run directory when it is unreadable (a run.json is rewritten only by a generate
#: pass that has images left to make)
RUN_FILE_FIXES = {
    "run.json": "restore it from a copy, or generate the run again into a new run_dir",
    FINGERPRINT_FILE: "delete it: a resume rebuilds it from the run's config.yaml",
    SHARDS_FILE: "delete it: the next shard to start writes it again",
}


def read_run_file(path: Path) -> Any:
    """A JSON file of a run directory (:data:`RUN_FILE_FIXES`); an unreadable one is a :class:`ConfigError` naming the
    file, where it breaks and how to recover."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        where = f": line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
        fix = RUN_FILE_FIXES.get(path.name, "restore it from a copy")
        if path.name == FINGERPRINT_FILE and not (path.parent / "config.yaml").exists():
            fix = f"restore it from a copy, or use a new run_dir ({path.parent} has no config.yaml to rebuild it from)"
        raise ConfigError(f"{path} is not valid JSON ({err.msg if where else err}{where}); {fix}") from None


def check_run_files(run_dir: Path) -> None:
    """Every JSON file of :data:`RUN_FILE_FIXES` that ``run_dir`` holds is readable (:func:`read_run_file`): checked
    before a stage that resumes or reads the run loads a model."""
    for name in RUN_FILE_FIXES:
        if (run_dir / name).is_file():
            read_run_file(run_dir / name)


def stored_fingerprint(run_dir: Path, new: dict[str, Any]) -> dict[str, Any] | None:
    """The directory's fingerprint: ``fingerprint.json``, else derived from an older run's ``config.yaml``
    (keys of :data:`ADDED_KEYS` that it lacks and the ``new`` fingerprint has take their implicit value)."""
    added = {k: v for k, v in ADDED_KEYS.items() if k in new}
    path = run_dir / FINGERPRINT_FILE
    if path.exists():
        return {**added, **current_fingerprint_names(read_run_file(path)["keys"])}
    config = run_dir / "config.yaml"
    if config.exists():
        old = OmegaConf.load(config)
        try:
            return {**added, **current_fingerprint_names(fingerprint(old, load_prompts(old.dataset)))}
        except (AttributeError, KeyError, ValueError, OSError) as err:  # an older layout, or its dataset file is gone
            raise ConfigError(
                f"{run_dir} has records but its settings cannot be rebuilt from {config} ({err}); use a new hydra.run.dir"
            ) from None
    return None


def has_records(run_dir: Path) -> bool:
    """Whether any records file of the run has at least one complete line."""
    for path in record_files(run_dir):
        with open(path, "rb") as f:
            if f.readline().endswith(b"\n"):
                return True
    return False


def shard_of(prompt_id: str, num_shards: int) -> int:
    """The shard that generates ``prompt_id``'s images: a stable hash of the id, not its rank, so membership
    depends only on the id and ``num_shards`` (an image's seed depends on its prompt index, not its shard)."""
    return int(hashlib.sha256(prompt_id.encode()).hexdigest(), 16) % num_shards


def shard_totals(prompts: list[Prompt], samples: int, num_shards: int) -> dict[str, int]:
    """Images each shard owes: records file name -> count."""
    totals = {records_file(k, num_shards): 0 for k in range(num_shards)}
    for prompt in prompts:
        totals[records_file(shard_of(prompt.prompt_id, num_shards), num_shards)] += samples
    return totals


def _create(path: Path, text: str) -> bool:
    """Create ``path`` with ``text`` atomically unless it exists (of racing processes one wins)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def check_shards(run_dir: Path, cfg: DictConfig, prompts: list[Prompt]) -> None:
    """Write ``shards.json`` (shard count + images per shard), or refuse another ``dataset.num_shards``.

    Every process of a run must split it the same way, or two of them could make one image; a longer
    prompt list (checked by :func:`check_fingerprint`) updates the counts.
    """
    n = cfg.dataset.num_shards
    new = {"num_shards": n, "totals": shard_totals(prompts, cfg.dataset.samples_per_prompt, n)}
    path = run_dir / SHARDS_FILE
    if _create(path, json.dumps(new, indent=1)):
        others = [p.name for p in record_files(run_dir) if p.name not in new["totals"]]
        if others:  # records from before shards.json existed, split otherwise
            path.unlink()
            raise ConfigError(f"dataset.num_shards={n}, but {run_dir} holds {', '.join(others)}; use the num_shards it was made with")
        return
    old = read_run_file(path)
    if old["num_shards"] != n:
        raise ConfigError(f"dataset.num_shards={n}, but {run_dir} is split into {old['num_shards']} shards; use dataset.num_shards={old['num_shards']}")
    if old != new:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(new, indent=1))
        os.replace(tmp, path)


def expected_images(run_dir: Path, n_images: int) -> dict[str, int]:
    """Records file -> images it should hold when the run is complete (``shards.json``, else run.json's count)."""
    path = run_dir / SHARDS_FILE
    return read_run_file(path)["totals"] if path.exists() else {RECORDS_FILE: n_images}


def shard_progress(run_dir: Path, info: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Records file -> (usable images, images owed), ``info`` being the run's run.json (empty if it has none).

    Counts the records a resume keeps (:func:`csd.records.usable_lines`: readable, first of their image, made
    with run.json's settings, image readable), so an image whose record a resume would set aside is owed.
    """
    settings = {k: info.get(k) for k in SETTINGS_FIELDS} if info else None
    return {
        name: (len(usable_lines(run_dir / name, settings).done), total)
        for name, total in expected_images(run_dir, info.get("n_images", 0)).items()
    }


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every key whose value differs (``<absent>`` where a side lacks it)."""
    def show(keys: dict[str, Any], key: str) -> str:
        return repr(keys[key]) if key in keys else "<absent>"

    return [f"{k}: {show(old, k)} -> {show(new, k)}" for k in sorted(old.keys() | new.keys()) if show(old, k) != show(new, k)]


def extends(old: dict[str, Any], new: dict[str, Any], prompts: list[Prompt]) -> bool:
    """Whether ``new`` only adds prompts after the old list (a larger ``dataset.n_prompts``).

    An image's seed depends on its prompt's index and sample only, so the images already made stay
    exactly what the longer run would have made.
    """
    count = old.get("dataset.prompt_count")
    same_otherwise = {k: v for k, v in old.items() if k not in PROMPT_LIST_KEYS} == {
        k: v for k, v in new.items() if k not in PROMPT_LIST_KEYS
    }
    return (
        same_otherwise and isinstance(count, int) and count <= len(prompts)
        and prompts_sha256(prompts[:count]) == old.get("dataset.prompts_sha256")
    )


def check_fingerprint(run_dir: Path, cfg: DictConfig, prompts: list[Prompt]) -> None:
    """Write ``fingerprint.json``, or refuse to add images to records made under other settings.

    Raises :class:`ConfigError` naming every differing key (old -> new). A directory without records
    takes the new fingerprint; so does one whose prompt list the new one extends (see :func:`extends`).
    """
    new = fingerprint(cfg, prompts)
    sharded = cfg.dataset.num_shards > 1
    if sharded and not (run_dir / FINGERPRINT_FILE).exists():
        _create(run_dir / FINGERPRINT_FILE, json.dumps({"sha256": _digest(new), "keys": new}, indent=1))
    # a shard compares with the fingerprint even before any records: another shard may be loading its model
    if has_records(run_dir) or (sharded and (run_dir / FINGERPRINT_FILE).exists()):
        old = stored_fingerprint(run_dir, new)
        if old is None:
            raise ConfigError(
                f"{run_dir} has records but no {FINGERPRINT_FILE} or config.yaml, so what made them is unknown; "
                "use a new hydra.run.dir"
            )
        if old != new and not extends(old, new, prompts):
            raise ConfigError(
                f"{run_dir} holds images made with other settings ({', '.join(differences(old, new))}); "
                "resume with the original values or use a new hydra.run.dir"
            )
    tmp = run_dir / f"{FINGERPRINT_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"sha256": _digest(new), "keys": new}, indent=1))
    os.replace(tmp, run_dir / FINGERPRINT_FILE)


def lock_file(shard: int, num_shards: int) -> str:
    """``.lock`` for an unsharded run, ``.lock.shard-003-of-008`` for a shard."""
    return LOCK_FILE if num_shards == 1 else f"{LOCK_FILE}.{shard_suffix(shard, num_shards)}"


def live_writers(run_dir: Path) -> list[tuple[Path, str]]:
    """``(lock file, holder)`` of every generate lock of ``run_dir`` (its own, its shards') whose holder may
    still be writing records (:func:`csd.lockfile.lock_holder`: a lock left by a process gone from this host
    is not)."""
    pattern = re.escape(LOCK_FILE) + r"(\.shard-\d+-of-\d+)?"
    locks = [run_dir / LOCK_FILE, *sorted(run_dir.glob(f"{LOCK_FILE}.shard-*"))]
    named = [lock for lock in locks if re.fullmatch(pattern, lock.name)]  # not a lock being taken over
    return [(lock, holder) for lock in named if (holder := lock_holder(lock))]


class RunLock(FileLock):
    """:class:`FileLock` that also records ``$SLURM_JOB_ID`` and takes over a lock of the same SLURM job.

    A requeued job (preempted, or resubmitted after its time limit) keeps its job id but may run on another
    host, where the killed process's pid cannot be checked; SLURM never runs two instances of one job, so
    a lock naming this job id is the previous instance's and stale.
    """

    def __init__(self, path: str | Path, what: str | None = None) -> None:
        super().__init__(path, what)
        self.job_id = os.environ.get("SLURM_JOB_ID")
        if self.job_id:
            self.owner["slurm_job_id"] = self.job_id

    def _check_holder(self) -> None:
        try:
            stale = self.path.read_bytes()
            holder = json.loads(stale)
        except (OSError, ValueError):
            holder = None
        if self.job_id and isinstance(holder, dict) and holder.get("slurm_job_id") == self.job_id:
            self._remove_if_unchanged(stale)
            return
        super()._check_holder()


def generate_lock(run_dir: Path, shard: int = 0, num_shards: int = 1) -> FileLock:
    """The exclusive lock of the generate stage on one shard of ``run_dir`` (one writer per records file)."""
    what = f"run directory {run_dir}" + (f" shard {shard} of {num_shards}" if num_shards > 1 else "")
    return RunLock(run_dir / lock_file(shard, num_shards), what=what)
