"""csd-bench entry point: ``python run.py [stage=generate|evaluate|report|all] method=... model=... dataset=...``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from csd.cli import run_stages


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_stages(cfg)


if __name__ == "__main__":
    main()
