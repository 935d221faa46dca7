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


def imported_distributions(paths: list[Path]) -> dict[str, set[str]]:
    """Distribution (normalised name) -> the files that import one of its top-level modules (the standard library and
    this repository's own packages left out)."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    owners = packages_distributions()
    own = {"csd", "baselines", "experiments", "tests"}
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top in own or top in sys.stdlib_module_names:
                    continue
                for dist in owners.get(top, [top]):
                    found.setdefault(normalise(dist), set()).add(str(path.relative_to(ROOT)))
    return found


def normalise(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    import re

    return {normalise(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in requirements}


#: declared dependencies the package uses through another package's API, not by an import of its own
USED_THROUGH = {"tabulate": "pandas.DataFrame.to_markdown (the report's tables)",
                "torch-fidelity": "torchmetrics' FID and Inception Score feature networks"}


def test_the_declared_dependencies_are_the_imported_ones() -> None:
    """Every distribution the package (``csd``, ``baselines``, ``run.py``) imports is declared (dependencies, or an
    extra for the optional evaluators and launchers), and every declared dependency is imported somewhere there or
    used through another package (:data:`USED_THROUGH`)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = requirement_names(project["dependencies"])
    extras = set().union(*(requirement_names(r) for r in project["optional-dependencies"].values()))
    code = [*sorted((ROOT / "csd").rglob("*.py")), *sorted((ROOT / "baselines").rglob("*.py")), ROOT / "run.py"]
    imported = imported_distributions(code)
    undeclared = {d: sorted(files)[:3] for d, files in imported.items() if d not in declared | extras}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    unused = declared - set(imported) - set(USED_THROUGH)
    assert not unused, f"declared in pyproject.toml but imported nowhere in the package: {sorted(unused)}"
