"""Every experiment script runs one way, ``python -m experiments.<name> ...`` from the repository root
(experiments/_entry.py): as a module it shows its ``--help``; run by path it refuses in one line naming that command,
before importing anything heavy; the documentation names no other form. Scripts are found by glob, so a new one is
covered; files starting with ``_`` (``__init__``, the guard's helper) are not scripts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.test_docs import repository_files

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (REPO / "experiments").glob("*.py") if not p.name.startswith("_"))

#: runs ``python -m experiments.<name> --help`` for every name in argv in this one interpreter: ``runpy.run_module``
#: with ``alter_sys`` is what ``-m`` does, and importing csd (~10 s on a shared 2-core machine) once instead of once
#: per script keeps the test short (``--dist loadfile`` would run per-script subprocesses one after the other)
HELP_DRIVER = """
import contextlib, io, json, runpy, sys, traceback, warnings
warnings.simplefilter("ignore", RuntimeWarning)  # a sibling already imported by an earlier script
results = {}
for name in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [name, "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(f"experiments.{name}", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
        except BaseException:
            code = traceback.format_exc()
    results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""

#: packages the guard must refuse before: each raises on import (first on PYTHONPATH in the by-path runs)
HEAVY = ("torch", "transformers", "numpy", "PIL", "omegaconf", "hydra", "csd", "experiments")


def test_scripts_are_found() -> None:
    assert {"gpu_check", "bench_throughput", "train_drafter"} <= set(SCRIPTS)


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-c", HELP_DRIVER, *SCRIPTS], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_help_as_a_module(helps: dict[str, dict], name: str) -> None:
    """``python -m experiments.<name> --help`` exits 0 with a usage line naming that command (argparse's ``prog``)."""
    result = helps[name]
    assert result["code"] == 0, (result["code"], result["stderr"][-2000:])
    assert result["stdout"].startswith(f"usage: python -m experiments.{name} "), result["stdout"][:300]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_run_by_path_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """``python experiments/<name>.py ARGS``: status 2, one stderr line with the ``-m`` command and ARGS, nothing on
    stdout, and no heavy import first (each package of ``HEAVY`` raises here)."""
    for package in HEAVY:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise ImportError('{package} imported before the guard')\n")
    done = subprocess.run([sys.executable, f"experiments/{name}.py", "--out", "a b", "model=toy"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"run it as a module from the repository root: python -m experiments.{name} --out 'a b' model=toy"]


#: a script run by path (``python experiments/x.py``, also behind ``PYTHONPATH=...``) or a code span that gives a
#: script's path with arguments, as a command
PATH_RUN = re.compile(r"\bpython3?\s+\S*experiments/\w+\.py|`experiments/\w+\.py\s+[^`]"
                      r"|PYTHONPATH=\S+\s+python3?\s+(?:-m\s+)?experiments")


def test_docs_name_the_module_form_only() -> None:
    """README, docs, docstrings, configs, notebooks and error messages say ``python -m experiments.<name>``."""
    files = [p for p in repository_files() if p.suffix in {".md", ".py", ".yaml", ".sh", ".ipynb", ".txt"}
             and p != Path(__file__)]
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in files
             for m in PATH_RUN.finditer(p.read_text(encoding="utf-8"))]
    assert any(p.name == "README.md" for p in files)
    assert found == [], f"use `python -m experiments.<name> ...` from the repository root: {found}"


def test_bench_drafters_summary_pairs_against_the_first_spec() -> None:
    """``experiments.bench_drafters --summary``: seconds per image over all rounds, the speed-up as the ratio of summed
    times against the first spec at the same B, step compression as tokens / forwards."""
    from experiments.bench_drafters import summary

    rows = [{"spec": s, "batch": b, "seconds": t, "tokens": 40, "nfe": n}
            for s, b, t, n in [("chain:window=1", 1, 4.0, 40), ("eagle", 1, 1.0, 10), ("chain:window=1", 1, 6.0, 40),
                               ("eagle", 1, 3.0, 20), ("eagle", 16, 0.5, 10)]]
    table = summary(rows, ["chain:window=1", "eagle"], images=2, rounds=2).splitlines()
    assert "| `chain:window=1` | 1 | 2.500 | 1.00 | 1.00 |" in table
    assert "| `eagle` | 1 | 1.000 | 2.50 | 2.67 |" in table
    assert "| `eagle` | 16 | 0.250 |  | 4.00 |" in table  # no first-spec time at B = 16: no ratio
