"""csd-bench entry point: ``python run.py [stage=generate|evaluate|report|status|study|all] method=... model=... dataset=...``."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from csd.cli import check_command_line, run_stages


def output_dir(stage: str, run_dir: str | None, sweep_dir: str | None, report_dir: str | None, new_dir: str) -> str:
    """Hydra's run directory (``.hydra/``, ``run.log``), so that no invocation leaves a stray directory.

    ``run_dir`` when given (evaluating a run writes next to it); for ``stage=report`` the report's directory
    (``report_dir``, else ``<sweep_dir or run_dir>/report``); for ``stage=status`` the directory it reads and
    for ``stage=study`` the one it writes (``sweep_dir`` or ``run_dir``); else ``new_dir``, a new timestamped run.
    """
    if stage == "report" and (sweep_dir or run_dir):
        return report_dir or str(Path(sweep_dir or run_dir) / "report")
    if stage in ("status", "study") and (sweep_dir or run_dir):
        return sweep_dir or run_dir
    return run_dir or new_dir


OmegaConf.register_new_resolver("csd_output_dir", output_dir)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_stages(cfg)


if __name__ == "__main__":
    check_command_line(sys.argv[1:])  # typos get one line with the closest keys, not Hydra's "+key=..." hint
    main()
