"""What a wheel of csd-bench ships: every data file under ``csd/`` (the toy models, their heads, the tokenizer, the
toy-CLIP, the class lists, the model card) matches a pattern of ``[tool.setuptools.package-data]``, so that a
non-editable install (``pip install .``, a wheel on a cluster) finds the files a clone finds."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def package_data_patterns() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]


def data_files() -> list[Path]:
    return sorted(p for p in (ROOT / "csd").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


def test_every_data_file_under_csd_is_package_data():
    patterns = package_data_patterns()
    files = data_files()
    assert any(p.suffix == ".safetensors" for p in files)  # the walk sees the shipped weights
    missing = [str(p.relative_to(ROOT)) for p in files if not any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    assert not missing, f"not in a wheel (add their pattern to [tool.setuptools.package-data]): {missing}"
