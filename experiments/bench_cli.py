"""How fast ``run.py`` answers (docs/PERFORMANCE.md, "The command line"): the median wall time of a command line, over
``--repeats`` runs each, for one or more checkouts (``--repo``, paired in one process: the same machine, interleaved).

Cases: a typo (``method=sdj``), a bad value (``method.lam=-1``), ``--help`` and ``stage=status`` on a committed run. Every
command is refused or answers without loading a model, so the time is what the command line costs before any work::

    python -m experiments.bench_cli --repo . ../older-checkout --repeats 5
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: case -> run.py's arguments
CASES = {
    "typo": ["method=sdj"],
    "bad value": ["method=csd", "method.lam=-1"],
    "--help": ["--help"],
    "stage=status": ["stage=status", "run_dir=results/toy_paper/0_ar"],
}


def wall_time(repo: Path, args: list[str]) -> tuple[float, int, str]:
    """Seconds of one ``python run.py <args>`` in ``repo`` (its own ``csd``), its exit status and last output line."""
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "run.py", *args], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = (result.stderr or result.stdout).strip().splitlines()
    return seconds, result.returncode, lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench_cli", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", nargs="+", type=Path, default=[Path(".")], help="checkouts to time (run.py in each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], str] = {}
    for _ in range(args.repeats):  # interleaved: a slow moment of the machine hits every checkout alike
        for case in args.cases:
            for repo in args.repo:
                seconds, status, last = wall_time(repo.resolve(), CASES[case])
                times.setdefault((str(repo), case), []).append(seconds)
                answers[(str(repo), case)] = f"exit {status}: {last[:90]}"
    print(f"| checkout | case | median s (of {args.repeats}) | min s | max s | answer |\n|---|---|---|---|---|---|")
    for (repo, case), values in times.items():
        print(f"| {repo} | {case} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} | "
              f"{answers[(repo, case)]} |")


if __name__ == "__main__":
    main()
