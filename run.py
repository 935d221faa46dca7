"""csd-bench entry point: ``python run.py [stage=generate|evaluate|report|status|study|plan|all] method=... model=... dataset=...``."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from csd.cli import check_command_line, run_stages


def output_dir(stage: str, run_dir: str | None, sweep_dir: str | None, new_dir: str, read_log_dir: str) -> str:
    """Hydra's run directory (``.hydra/``, ``run.log``): the directory a stage works in, not a stray new one.

    ``run_dir`` when given (evaluating a run writes next to it); for ``stage=plan``, and for ``stage=report``,
    ``stage=status`` and ``stage=decode`` on a sweep or run, ``read_log_dir`` (``runs/<stage>/<time>``): they only read
    that directory (the report writes just its own files, decode just the images), so running them on committed
    results leaves Hydra's files elsewhere; for ``stage=study`` the directory it writes (``sweep_dir`` or
    ``run_dir``); else ``new_dir``, a new timestamped run.
    """
    if (stage in ("report", "status", "decode") and (sweep_dir or run_dir)) or stage == "plan":
        return read_log_dir
    if stage == "study" and (sweep_dir or run_dir):
        return sweep_dir or run_dir
    return run_dir or new_dir


OmegaConf.register_new_resolver("csd_output_dir", output_dir)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_stages(cfg)


if __name__ == "__main__":
    check_command_line(sys.argv[1:])  # every check of the run, in one line, before Hydra creates a directory
    main()
