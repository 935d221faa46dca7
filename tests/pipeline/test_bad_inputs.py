"""What a new user types into ``run.py``: every bad or edge input is refused in one line that names the value and what
is allowed, with exit status 2, before any model loads and before any directory is created.

:data:`CASES` is the audit's table: one row per input, grouped by kind; the next audit adds rows here. The default
suite runs every row in this process through :func:`csd.cli.preflight` (what ``run.py`` runs before Hydra creates a
directory). ``pytest -m audit`` runs every row as a user does, ``python run.py ...`` in a subprocess in an empty
directory, and checks the whole contract: exit status 2, stderr exactly one ``error: ...`` line, no traceback, no file
created, within :data:`AUDIT_SECONDS` (a timeout, not a timing) and under :data:`AUDIT_MEMORY` of address space (a guard that fails shows as a
killed process, not as a machine out of memory).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from csd.adapters.base import MIN_TRANSFORMERS, check_transformers
from csd.cli import preflight
from csd.errors import INPUT_ERRORS, DependencyError

ROOT = Path(__file__).resolve().parents[2]
#: the audit's limits per input: wall seconds, bytes of address space (torch's CPU import maps about 3 GB)
AUDIT_SECONDS = 60
AUDIT_MEMORY = 8 * 2**30


@dataclass(frozen=True)
class Case:
    """One input. ``args``: the command line (``{dir}`` stands for the case's own empty directory, the working
    directory of the run); ``says``: a regular expression the one error line matches (``re.search``); ``setup``:
    writes the files the input needs (a corrupt run, a text file given as weights) into that directory first."""

    args: tuple[str, ...]
    says: str
    setup: Callable[[Path], None] | None = None

    @property
    def id(self) -> str:
        return " ".join(self.args).replace("{dir}", "DIR")[:90]


def case(*args: str, says: str, setup: Callable[[Path], None] | None = None) -> Case:
    return Case(args, says, setup)


def text_file(where: Path) -> None:
    (where / "head.pt").write_text("not a checkpoint\n")


def fake_run(where: Path) -> Path:
    """A generated toy run's files, as far as the stages read them before decoding: config, run.json, a record."""
    run = where / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"method": "csd", "model": "toy", "dataset": "toy", "seed": 0,
                                              "n_images": 1, "method_params": {}}))
    (run / "records.jsonl").write_text(json.dumps({"prompt_id": "toy-0000", "sample": 0, "image": "x.png"}) + "\n")
    (run / "config.yaml").write_text("seed: 0\n")
    return run


def corrupt_run_json(where: Path) -> None:
    (fake_run(where) / "run.json").write_text('{"method": "cs')


def corrupt_fingerprint(where: Path) -> None:
    (fake_run(where) / "fingerprint.json").write_text('{"sha256": ')


def coco_captions(where: Path) -> None:
    annotations = [{"id": 10, "image_id": 1, "caption": "a red apple"}, {"id": 11, "image_id": 2, "caption": "  "}]
    data = {"images": [{"id": 1}, {"id": 2}], "annotations": annotations}
    (where / "captions.json").write_text(json.dumps(data))


def unicode_geneval(where: Path) -> None:
    (where / "meta.jsonl").write_text(json.dumps({"prompt": "un café rouge"}, ensure_ascii=False) + "\n")


def long_caption(where: Path) -> None:
    """A GenEval metadata file whose second prompt is 96000 characters long."""
    lines = [{"tag": "single_object", "prompt": p} for p in ("a photo of a cat", "a cat " * 16000)]
    (where / "long.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


CASES: list[Case] = [
    # --- typos and unknown names ---
    case("methd=csd", says="methd"),
    case("method=nope", says="nope"),
    case("method.lamda=0.3", says="method.lamda"),
    # --- Hydra's grammar: one line, not its multi-line report ---
    case("method.lam", says=r"method.lam: .*write method.lam=<value>"),
    case("hydra.foo=1", says=r"hydra.foo is not a Hydra setting"),
    # --- types and ranges ---
    case("method.lam=abc", says="method.lam='abc' must be a finite number >= 0"),
    case("seed=abc", says="seed='abc' must be an integer >= 0"),
    case("threads=0", says="threads=0 must be an integer >= 1"),
    # --- directories ---
    case("stage=evaluate", says="stage=evaluate needs run_dir=<dir>"),
    case("stage=evaluate", "run_dir={dir}/nope", says="does not exist"),

    # --- resource guards: sizes that scale memory or time ---
    case("engine.batch_size=1000000000", "dataset.n_prompts=1",
         says=r"engine\.batch_size=1000000000 is more than the run's 1 images .*set engine\.batch_size <= 1"),
    case("eval.bootstrap=1000000000", says=r"eval\.bootstrap=1000000000 needs .* GB .*available RAM"),
    case("eval.content.entropy_bins=1000000000", says=r"eval\.content\.entropy_bins=1000000000 needs .* GB .*available RAM"),
    case("threads=100000", says=r"threads=100000 is more than the \d+ cores"),
    case("model=janus_pro_tiny", "dataset=geneval", "dataset.metadata={dir}/long.jsonl", setup=long_caption,
         says=r"dataset\.metadata=.*prompt 1 \(00001\) is 96000 bytes long; model=janus_pro_tiny holds 1024 positions"),
    case("engine.warmup=1000000", says=r"engine\.warmup=1000000 is more than the run's 16 images"),
    case("dataset.samples_per_prompt=1000000", says=r"dataset\.samples_per_prompt=1000000 must be <= 1009"),
    case("drafter=pac_tree", "drafter.depth=1000", says=r"drafter\.window=64 cannot hold the tree of drafter\.width=4, drafter\.depth=1000 "
                                                   r"\(more than 64 nodes.*at most drafter\.depth=3 fits(?=.{0,80}$)"),
    case("model.top_k=1000000", says=r"model\.top_k=1000000 is more than model=toy's 256 image codes"),

    case("dataset.n_prompts=100000000", says=r"dataset.n_prompts=100000000, but dataset=toy has 10000 prompts"),

    # --- silent inputs: accepted before, refused now ---
    case("run_dir=", says=r"run_dir='' is empty"),
    case("run_dir='  '", says=r"run_dir='  ' is empty"),
    case("stage=status", "sweep_dir=", says=r"sweep_dir='' is empty"),
    case("stage=plan", "stage=generate", says=r"stage is given twice \(stage=plan, stage=generate\)"),
    case("seed=99999999999999999999", says=r"seed=99999999999999999999 must be an integer in \[0, 4611686018427387903\]"),
    case("drafter.window=100000", says=r"drafter\.window=100000 is longer than model=toy's image \(256 tokens\)"),
    case("drafter=draft_model", "drafter.gamma=100000", says=r"drafter\.gamma=100000 .*longer than model=toy's image"),
    case("eval.metrics=[geneval]", says=r"eval\.metrics=\['geneval'\]: model=toy has no 'geneval' metric .*'regions'"),

    # --- tracebacks before: run files, weights, data paths ---
    case("~method", says=r"~method deletes the config group method, which every run reads"),
    case("~seed", says=r"~seed deletes the key seed, which every run reads"),
    case("method=null", says=r"method=null: a run needs a method; choose one of the \d+ options in conf/method/"),
    case("drafter=eagle", "drafter.head={dir}/head.pt", says=r"drafter.head=\S*head.pt is not .*torch.save", setup=text_file),
    case("run_dir=/proc/x", says=r"run_dir=/proc/x: .*not writable"),
    case("stage=evaluate", "run_dir={dir}/run", says=r"run.json is not valid JSON \(Unterminated string .*: line 1 column \d+\); "
         r"restore it", setup=corrupt_run_json),
    case("run_dir={dir}/run", says=r"fingerprint.json is not valid JSON.*delete it", setup=corrupt_fingerprint),
    case("model=janus_pro_tiny", "dataset=coco2017", "dataset.annotations={dir}", says=r"dataset.annotations=\S+ is a directory"),

    # --- Hydra's and other verbose errors ---
    case("method.lam=[1", says=r"method.lam=\[1: Hydra cannot parse it .*quote a value"),
    case("hydra/launcher=slurm", says=r"hydra/launcher=slurm is not an option of hydra/launcher; choose one of .*'local_procs'"),

    # --- the toy's vocabulary and prompts ---
    case("dataset=smoke", says=r"dataset=smoke prompt smoke-000 has \d+ unknown words \('apple', .*\(2 of 2 prompts "
         r"cannot be read\): model=toy reads only the 26 words .*use dataset=toy"),
    case("model=janus_pro_tiny", "dataset=coco2017", "dataset.annotations={dir}/captions.json",
         "dataset.n_prompts=null", setup=coco_captions,
         says=r"dataset=coco2017 prompt 11 \(index 1\) is empty: every prompt needs text"),
    case("dataset=geneval", "dataset.metadata={dir}/meta.jsonl", setup=unicode_geneval,
         says=r"dataset=geneval prompt 00000 has 3 unknown words \('un', 'café', 'rouge'\) \(1 of 1 prompts "
         r"cannot be read\): model=toy reads only the 26 words of its scene captions \(csd\.toy\.vocab\.WORDS\), at most "
         r"\d+ a caption; use dataset=toy[^,]*$"),  # the unknown words named, not the 26 known ones

    # --- multiruns ---
    case("model=janus_pro_1b", says=r"Janus-Pro files not found at 'deepseek-community/Janus-Pro-1B'"),

]


def materialise(c: Case, where: Path) -> list[str]:
    """The case's command line in ``where`` (its setup run there first)."""
    if c.setup is not None:
        c.setup(where)
    return [arg.replace("{dir}", str(where)) for arg in c.args]


def listing(where: Path) -> set[Path]:
    return set(where.rglob("*"))


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_refused_in_one_line_before_anything_is_created(c: Case, tmp_path: Path, monkeypatch) -> None:
    args = materialise(c, tmp_path)
    before = listing(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(INPUT_ERRORS, match=c.says) as err:
        preflight(args)
    assert "\n" not in str(err.value).strip()
    assert listing(tmp_path) == before


def cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AUDIT_MEMORY, AUDIT_MEMORY))


@pytest.mark.audit
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_audit_run_py(c: Case, tmp_path: Path) -> None:
    args = materialise(c, tmp_path)
    before = listing(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=AUDIT_SECONDS, preexec_fn=cap_memory)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert re.search(c.says, lines[0]), lines[0]
    assert listing(tmp_path) == before, sorted(map(str, listing(tmp_path) - before))


@pytest.mark.slow
def test_multirun_without_weights_is_refused_before_any_job_or_directory(tmp_path: Path) -> None:
    """A sweep is checked job by job before its launcher starts (csd.sweep), weights included: ``-m`` skips
    :func:`preflight`, so this runs ``run.py`` as the audit does."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", "method=sjd,csd", "model=janus_pro_1b"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=AUDIT_SECONDS,
                         preexec_fn=cap_memory)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1, out.stderr[-2000:]  # the same problem in both jobs: said once, naming them
    assert lines[0].startswith("error: jobs #0, #1 (model=janus_pro_1b; #0 method=sjd, #1 method=csd): Janus-Pro files "
                               "not found at 'deepseek-community/Janus-Pro-1B'")
    assert "Launching" not in out.stdout + out.stderr
    assert listing(tmp_path) == set()  # no sweep directory, no job directory


@pytest.mark.parametrize("installed", ["5.17.0", "5.23.0", "4.57.1"])
def test_a_transformers_older_than_the_adapters_need_is_one_line(installed: str) -> None:
    """Before 5.24 the decoders read ``past_key_values=`` and ignore the adapters' ``cache=``: a shape error deep in
    the attention (seen with 5.17 on a GPU image), refused instead by name."""
    with pytest.raises(DependencyError, match=rf"^transformers {re.escape(installed)} is installed; the model adapters "
                       rf"need transformers >= {MIN_TRANSFORMERS} .*pip install 'transformers=={MIN_TRANSFORMERS}'$"):
        check_transformers(installed)
    for fine in (MIN_TRANSFORMERS, "5.25.0", None):  # None: the installed one, the pinned release
        check_transformers(fine)


def test_an_old_transformers_is_refused_before_anything_is_created(tmp_path: Path, monkeypatch) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.17.0" if name == "transformers" else real(name))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(INPUT_ERRORS, match=r"^transformers 5\.17\.0 is installed") as err:
        preflight(["model=toy", "dataset=toy"])
    assert "\n" not in str(err.value).strip()
    assert listing(tmp_path) == set()


def test_a_transformers_without_metadata_is_read_by_its_version(monkeypatch) -> None:
    """A source checkout on the path has no package metadata: its ``__version__`` decides."""
    import transformers

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    check_transformers()
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(DependencyError, match=r"^transformers 5\.17\.0 is installed"):
        check_transformers()
