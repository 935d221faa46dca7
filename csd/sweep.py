"""Every job of a multirun is composed and checked in the submitting process before the first one starts.

Hydra composes a job only when its launcher reaches it, and our checks run inside the job: a sweep whose second
job is invalid ran its first in full. :class:`SweepCheckCallback` (``hydra.callbacks`` in ``conf/config.yaml``)
expands the sweep as Hydra's basic sweeper will, composes each job's config as the launchers do and runs the
checks of a single run on it (:func:`csd.validate.validate`, :func:`csd.cli.check_inputs`), once, before any job is
launched (the submitit launchers included); bad jobs end the sweep with one line per distinct problem, naming the jobs
that have it.
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import filter_overrides
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from csd.cli import check_inputs
from csd.errors import ConfigError, MissingWeightsError, RecordsError
from csd.validate import validate

#: the sweeper whose expansion :func:`sweep_jobs` reproduces
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(sweep: DictConfig) -> list[list[str]]:
    """Each job's overrides, in launch order: ``hydra.sweeper.params`` then the command line, expanded as
    ``BasicSweeper.sweep`` does (the cartesian product of the swept values)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = OmegaConf.select(sweep, "hydra.sweeper.params") or {}
    args = [f"{key}={value}" for key, value in params.items()] + list(sweep.hydra.overrides.task)
    overrides = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(args)
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def job_config(loader: ConfigLoader, sweep: DictConfig, overrides: list[str], num: int) -> DictConfig:
    """Job ``num``'s config as its launcher composes it (``load_sweep_config``), without the ``hydra`` node, and
    ``run_dir`` its output directory unless the command line gives one."""
    cfg = loader.load_sweep_config(sweep, overrides)
    with open_dict(cfg.hydra.job):
        cfg.hydra.job.num = num
    job_dir = str(Path(cfg.hydra.sweep.dir) / cfg.hydra.sweep.subdir)
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        del task["hydra"]
        if task.get("run_dir") is None:
            task.run_dir = job_dir
    return task


def sweep_problems(sweep: DictConfig) -> list[str]:
    """One line per problem a single run would refuse, naming the jobs that have it (:func:`problem_lines`)."""
    loader = GlobalHydra.instance().config_loader()
    found = []
    for num, overrides in enumerate(sweep_jobs(sweep)):
        try:
            cfg = job_config(loader, sweep, overrides, num)
            validate(cfg)
            check_inputs(cfg, overrides)
        except (ConfigError, RecordsError, MissingWeightsError, FileNotFoundError, HydraException) as err:
            found.append((num, filter_overrides(overrides), " ".join(str(err).split())))  # Hydra's errors span lines
    return problem_lines(found)


def problem_lines(found: list[tuple[int, list[str], str]]) -> list[str]:
    """``(job number, its overrides, problem)`` -> one line per distinct problem, in order of first appearance:
    ``job #<n> (<overrides>): <problem>`` for one job; for several, the overrides they share once and what each
    job sets apart: ``jobs #0, #1 (model=x; #0 method=sjd, #1 method=csd): <problem>``."""
    by_problem: dict[str, list[tuple[int, list[str]]]] = {}
    for num, overrides, problem in found:
        by_problem.setdefault(problem, []).append((num, overrides))
    lines = []
    for problem, jobs in by_problem.items():
        if len(jobs) == 1:
            num, overrides = jobs[0]
            lines.append(f"job #{num} ({' '.join(overrides)}): {problem}")
            continue
        shared = [o for o in jobs[0][1] if all(o in overrides for _, overrides in jobs)]
        own = ", ".join(f"#{num} {' '.join(o for o in overrides if o not in shared)}".rstrip() for num, overrides in jobs)
        numbers = ", ".join(f"#{num}" for num, _ in jobs)
        lines.append(f"jobs {numbers} ({' '.join(shared)}; {own}): {problem}")
    return lines


class SweepCheckCallback(Callback):
    """``on_multirun_start``: :func:`sweep_problems`; any ends the multirun (exit 2) before a job is launched."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
            return
        quiet = logging.getLogger("csd.validate")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # each job logs its own warnings when it runs
        try:
            problems = sweep_problems(config)
        finally:
            quiet.setLevel(level)
        if problems:
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            raise SystemExit(2)  # a BaseException: Hydra's callback runner would only warn about an Exception
