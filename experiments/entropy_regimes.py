"""The matched-compression study across entropy regimes: one table and one figure from finished study directories
(docs/RESULTS.md "Does the answer depend on entropy?", csd/report/regimes.py).

    python -m experiments.entropy_regimes results/entropy_study results/entropy_regimes/T* \
        [--out results/entropy_regimes/report] [--bootstrap 1000]

Each directory is a study's root (``stage=study``: ``ar/``, ``sjd/``, the rules' runs, ``study/study.json``);
writes ``regimes.md``, ``regimes.json`` and ``regimes.png`` under ``--out``, regimes ordered by AR's entropy.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
from pathlib import Path

from csd.report.regimes import build_regimes


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.entropy_regimes",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path, help="finished study directories, one per regime")
    parser.add_argument("--out", type=Path, default=Path("results/entropy_regimes/report"))
    parser.add_argument("--bootstrap", type=int, default=1000, help="prompt resamples of the paired intervals")
    args = parser.parse_args()
    if args.bootstrap < 0:
        parser.error(f"--bootstrap={args.bootstrap} must be >= 0")
    for root in args.roots:
        if not (root / "study" / "study.json").exists():
            parser.error(f"{root} is not a finished study directory (no study/study.json; the study resumes: rerun it)")
    try:
        build_regimes(args.roots, args.out, args.bootstrap)
    except ValueError as err:
        parser.error(str(err))
    print(f"{args.out / 'regimes.md'}\n{args.out / 'regimes.png'}")


if __name__ == "__main__":
    main()
