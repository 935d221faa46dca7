"""Loading hub files where the hub's host does not resolve and HF_HUB_OFFLINE is not set (csd/hub.py).

Every loader that can reach the Hugging Face hub (Janus-Pro, Lumina-mGPT / Emu3 snapshots, the GenEval
detector, open_clip tags) must end in its one-line missing-files error after at most one name lookup,
without a single retry of the hub client (each retry sleeps 1-8 s; a model needs several files). The
fixture makes every name lookup fail at once and counts lookups and the hub client's retry sleeps.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants as hub_constants
import pytest
import torch
from huggingface_hub.utils import _http

from csd import hub
from csd.adapters.janus import load_janus_adapter
from csd.adapters.lumina import _local_dir
from csd.errors import MissingWeightsError
from csd.evaluation.clip_score import load_open_clip
from csd.evaluation.geneval_score import load_detector

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_reachability() -> Iterator[None]:
    """Each test decides reachability anew (the answer is cached per process)."""
    hub.hub_reachable.cache_clear()
    yield
    hub.hub_reachable.cache_clear()


@pytest.fixture
def unresolvable_hub(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """HF_HUB_OFFLINE unset; every host name lookup fails at once. Returns the lookups and retry sleeps made."""
    calls: dict[str, list] = {"lookups": [], "sleeps": []}

    def failing_lookup(host: str, *args: object, **kwargs: object) -> list:
        calls["lookups"].append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", failing_lookup)
    monkeypatch.setattr(_http.time, "sleep", lambda seconds: calls["sleeps"].append(seconds))
    return calls


def test_reachability_is_asked_once_per_process(unresolvable_hub: dict[str, list]) -> None:
    assert not hub.hub_reachable() and not hub.hub_reachable()
    assert unresolvable_hub["lookups"] == ["huggingface.co"]


def test_reachability_follows_the_endpoint(unresolvable_hub: dict[str, list], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_constants, "ENDPOINT", "https://hub-mirror.example.invalid:8443")
    assert not hub.hub_reachable()
    assert unresolvable_hub["lookups"] == ["hub-mirror.example.invalid"]


def test_offline_env_needs_no_lookup(unresolvable_hub: dict[str, list], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    assert not hub.hub_reachable()
    assert unresolvable_hub["lookups"] == []


def test_a_resolver_that_does_not_answer_counts_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answer.wait())
    try:
        assert not hub.resolves("huggingface.co", timeout_s=0.01)
    finally:
        answer.set()


def test_local_first_tries_the_network_only_when_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt runs in the hub client's offline mode; a second, online, only if the hub resolves."""
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    modes: list[bool] = []

    def load_online_only() -> str:
        modes.append(hub_constants.is_offline_mode())
        if modes[-1]:
            raise OSError("not in the local cache")
        return "downloaded"

    monkeypatch.setattr(hub, "hub_reachable", lambda: True)
    assert hub.load_local_first(load_online_only) == "downloaded" and modes == [True, False]
    modes.clear()
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    with pytest.raises(OSError, match="not in the local cache"):
        hub.load_local_first(load_online_only)
    assert modes == [True] and not hub_constants.is_offline_mode()

    def cached() -> str:
        modes.append(hub_constants.is_offline_mode())
        return "cached"

    modes.clear()
    monkeypatch.setattr(hub, "hub_reachable", lambda: pytest.fail("a local hit must not ask for the network"))
    assert hub.load_local_first(cached) == "cached" and modes == [True]


def test_janus_hub_id_fails_in_one_line_without_retries(unresolvable_hub: dict[str, list]) -> None:
    with pytest.raises(MissingWeightsError, match="Janus-Pro files not found at 'nobody-here/no-such-janus'"):
        load_janus_adapter("nobody-here/no-such-janus", dtype="float32")
    assert unresolvable_hub["sleeps"] == [] and len(unresolvable_hub["lookups"]) <= 1


def test_snapshot_hub_id_fails_in_one_line_without_retries(unresolvable_hub: dict[str, list]) -> None:
    with pytest.raises(MissingWeightsError, match="Lumina-mGPT files not found at 'nobody-here/no-such-lumina'"):
        _local_dir("nobody-here/no-such-lumina", "Lumina-mGPT", "Alpha-VLLM/Lumina-mGPT-7B-768")
    assert unresolvable_hub["sleeps"] == [] and len(unresolvable_hub["lookups"]) <= 1


def test_a_cached_snapshot_is_used_without_a_lookup(
    unresolvable_hub: dict[str, list], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Local files first: a hub id already in the local cache resolves without touching the network."""
    commit = "0" * 40
    repo = tmp_path / "models--nobody-here--cached-lumina"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    assert _local_dir("nobody-here/cached-lumina", "Lumina-mGPT", "x") == str(repo / "snapshots" / commit)
    assert unresolvable_hub["lookups"] == []


def test_geneval_detector_fails_in_one_line_without_retries(unresolvable_hub: dict[str, list]) -> None:
    with pytest.raises(MissingWeightsError, match="GenEval detector files not found at 'nobody-here/no-such-m2f'"):
        load_detector("nobody-here/no-such-m2f", torch.device("cpu"))
    assert unresolvable_hub["sleeps"] == [] and len(unresolvable_hub["lookups"]) <= 1


def test_open_clip_tag_fails_in_our_line_only(
    unresolvable_hub: dict[str, list], caplog: pytest.LogCaptureFixture
) -> None:
    """The smoke run's CLIP score (ViT-B-16/openai): our error, no retry, and no ERROR line of open_clip's own."""
    with caplog.at_level(logging.INFO), pytest.raises(MissingWeightsError, match="CLIP weights ViT-B-16/openai"):
        load_open_clip("ViT-B-16", "openai", torch.device("cpu"))
    assert unresolvable_hub["sleeps"] == [] and len(unresolvable_hub["lookups"]) <= 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.slow
def test_cli_missing_model_prints_one_line_without_hub_retries(tmp_path: Path) -> None:
    """``python run.py model=janus_pro_7b`` without HF_HUB_OFFLINE, the hub unresolvable (HF_ENDPOINT on .invalid)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://nonexistent.invalid", WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "model=janus_pro_7b", "model.path=nobody-here/no-such-janus",
         "stage=generate", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("error: Janus-Pro files not found at 'nobody-here/no-such-janus'")
    assert "Retrying" not in out.stdout + out.stderr and "Traceback" not in out.stderr
