"""Run-directory integrity: the fingerprint of what determines the images, and the generate-stage lock.

``fingerprint.json`` holds a flat dict of dotted config keys (every ``method.*`` and ``model.*`` key,
``dataset.*`` but the evaluation-only ones, a sha256 of the prompt list, ``seed``, the device type,
``engine.compile``; null values left out) and their hash. Keys that do not change the images (logger,
progress bar, warm-up, cache length, batch size, latency probe, eval settings, threads) are left out, so
a resume may change them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from csd.config import ConfigError, load_prompts, resolve_device
from csd.lockfile import FileLock
from csd.prompts import Prompt
from csd.records import RECORDS_FILE

FINGERPRINT_FILE = "fingerprint.json"
LOCK_FILE = ".lock"
#: dataset keys read only by the evaluate stage
DATASET_EVAL_KEYS = ("fid_reference",)
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
    keys = {
        **_flatten(OmegaConf.to_container(cfg.method, resolve=True), "method"),
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


def stored_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """The directory's fingerprint: ``fingerprint.json``, else derived from an older run's ``config.yaml``."""
    path = run_dir / FINGERPRINT_FILE
    if path.exists():
        return json.loads(path.read_text())["keys"]
    config = run_dir / "config.yaml"
    if config.exists():
        old = OmegaConf.load(config)
        try:
            return fingerprint(old, load_prompts(old.dataset))
        except (AttributeError, KeyError, ValueError, OSError) as err:  # an older layout, or its dataset file is gone
            raise ConfigError(
                f"{run_dir} has records but its settings cannot be rebuilt from {config} ({err}); use a new hydra.run.dir"
            ) from None
    return None


def has_records(run_dir: Path) -> bool:
    """Whether ``records.jsonl`` has at least one complete line."""
    path = run_dir / RECORDS_FILE
    if not path.exists():
        return False
    with open(path, "rb") as f:
        return f.readline().endswith(b"\n")


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
    if has_records(run_dir):
        old = stored_fingerprint(run_dir)
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
    tmp = run_dir / f"{FINGERPRINT_FILE}.tmp"
    tmp.write_text(json.dumps({"sha256": _digest(new), "keys": new}, indent=1))
    os.replace(tmp, run_dir / FINGERPRINT_FILE)


def generate_lock(run_dir: Path) -> FileLock:
    """The exclusive lock of the generate stage on ``run_dir`` (one writer of ``records.jsonl``)."""
    return FileLock(run_dir / LOCK_FILE, what=f"run directory {run_dir}")
