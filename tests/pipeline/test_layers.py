"""The import layers of ``csd/`` hold (``[tool.importlinter]`` in pyproject.toml, docs/ARCHITECTURE.md): every import
points down, function-level and ``TYPE_CHECKING`` imports included; no two modules import each other, even through
others; ``baselines/`` uses the rule layer only; importing ``csd`` or checking a command line imports no model library.
Each check has a negative control: the same check on a copy of the code with one planted import fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: libraries that load models or draw: never imported by ``import csd``, a typo's check or ``--help``
HEAVY = ("transformers", "open_clip", "torchmetrics", "torch_fidelity", "matplotlib", "pandas", "wandb")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts on the code under ``root``."""
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports; raise SystemExit("
                           f"lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, cache_dir=None))"],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": ""}, capture_output=True, text=True,
                          timeout=300)


#: run with the code under test first on the path: prints a cycle of module imports of its ``csd`` package (any import
#: statement: module level, in a function, under ``TYPE_CHECKING``) as the modules around it, or ``[]``
CYCLE_PROBE = """
import json, grimp
graph = grimp.build_graph("csd", cache_dir=None)
imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
state, path = {}, []
def visit(module):
    state[module] = 1
    path.append(module)
    for imported in imports.get(module, []):
        if state.get(imported) == 1:
            return path[path.index(imported):] + [imported]
        if imported not in state and (cycle := visit(imported)):
            return cycle
    path.pop()
    state[module] = 2
    return None
print(json.dumps(next((c for m in sorted(imports) if m not in state and (c := visit(m))), [])))
"""


def module_cycle(root: Path) -> list[str]:
    """A cycle of imports among the modules of ``root``'s ``csd`` package, or ``[]`` (in a fresh interpreter: grimp
    finds a package where Python would import it)."""
    result = subprocess.run([sys.executable, "-c", CYCLE_PROBE], cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``csd/`` and ``baselines/`` in which the ground floor (``csd.errors``) imports the command line."""
    root = tmp_path_factory.mktemp("planted")
    for package in ("csd", "baselines"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    errors = root / "csd" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _planted() -> None:\n    from csd.cli import preflight  # noqa\n")
    return root


@pytest.mark.slow
def test_every_contract_is_kept() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_module_of_csd_is_in_a_layer_and_forbidden_to_baselines() -> None:
    """A module missing from the contracts would be checked by neither: each of ``csd``'s modules and packages is in
    exactly one layer, and forbidden to ``baselines/`` unless it is the rule layer."""
    import tomllib

    layers, forbidden = (c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
                         ["contracts"])
    layered = [name.strip() for line in layers["layers"] for name in line.split("|")]
    modules = sorted(f"csd.{p.stem if p.is_file() else p.name}" for p in (ROOT / "csd").iterdir()
                     if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file())
    assert sorted(layered) == modules
    assert sorted(forbidden["forbidden_modules"]) == sorted(set(modules) - {"csd.acceptance", "csd.params", "csd.schema"})


@pytest.mark.slow
def test_a_planted_upward_import_breaks_the_layers(planted: Path) -> None:
    result = lint(planted)
    assert result.returncode != 0
    assert "csd.errors -> csd.cli" in result.stdout


def test_no_module_imports_itself_through_others() -> None:
    assert module_cycle(ROOT) == []


def test_a_planted_circle_is_found(planted: Path) -> None:
    cycle = module_cycle(planted)
    assert "csd.errors" in cycle and "csd.cli" in cycle


def run_py(args: list[str]) -> str:
    """``run.py <args>`` (its ``__main__``) followed by ``sys.modules``' heavy libraries, as code for a probe."""
    return (f"import runpy; sys.argv = ['run.py', *{args!r}]; "
            f"runpy.run_path({str(ROOT / 'run.py')!r}, run_name='__main__')")


@pytest.mark.slow
@pytest.mark.parametrize("code", [
    "import csd",
    "import csd.cli",
    "from csd.cli import preflight; preflight(['method=sdj'])",
    "from csd.cli import preflight; preflight(['method=csd', 'method.lam=-1'])",
    run_py(["--help"]),
    run_py(["stage=status", f"run_dir={ROOT / 'results' / 'toy_paper' / '0_ar'}"]),
], ids=["import csd", "import csd.cli", "typo", "bad value", "--help", "stage=status"])
def test_light_entry_points_import_no_model_library(code: str, tmp_path: Path) -> None:
    """``import csd`` (the notebook API is imported on first use), ``run.py``'s module, a typo's and a bad value's
    checks, ``run.py --help`` and ``stage=status`` (Hydra's files of the command go under ``tmp_path``)."""
    probe = (f"import sys\ntry:\n    {code.replace('; ', chr(10) + '    ')}\nexcept BaseException as err:\n"
             "    print(type(err).__name__, err)\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "PATH": "", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "[]", result.stdout[-2000:]
    if "status" in code:
        assert "400/400 images" in result.stdout


@pytest.mark.slow
def test_a_typo_is_answered_without_torch() -> None:
    """The cheapest check runs first: a typo needs the config files and the key table only."""
    probe = ("import sys\nfrom csd.cli import preflight\nfrom csd.errors import ConfigError\ntry:\n"
             "    preflight(['method=sdj'])\nexcept ConfigError as err:\n    print(err)\n"
             "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "PATH": "", "HF_HUB_OFFLINE": "1"})
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("method='sdj': did you mean sjd?") and lines[-1] == "False", result.stdout + result.stderr
