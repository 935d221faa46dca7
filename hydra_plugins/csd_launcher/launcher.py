"""Hydra's submitit launchers (``conf/hydra/launcher/``), ending a sweep with one line per failed job.

A Hydra plugin module: Hydra imports it whenever it scans for plugins, so csd-bench itself (torch, ...) is
imported only when a job failed.

hydra-submitit-launcher 1.2.0 waits for its jobs in order and re-raises the first failure: submitit's exception,
some 30 lines holding the job's traceback (or, for a killed job, its state), and nothing about what to do. These
launchers wait for every job, then print for each failed one a line naming it, what stopped it and how to rerun
it (:func:`csd.cli.interrupted_message`: a shard alone into its run directory), and end the sweep (exit 1).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

log = logging.getLogger(__name__)
#: how the job's own last line starts when csd-bench stopped it (csd.cli.run_stages)
OWN_LINES = ("error: ", "interrupted: ")


def failure_line(num: int, overrides: list[str], cfg: Any, job: Any, err: Exception) -> str:
    """One line for job ``num`` (config ``cfg``) that ``err`` (submitit's ``FailedJobError`` or
    ``UncompletedJobError``) stopped: the job's own one-line error when it printed one (its last ``error:`` or
    ``interrupted:`` line), else what submitit saw (a traceback's last line, or the job's state when it ended
    without a result: killed, cancelled, out of time), then what is kept, how to rerun it and where its log is."""
    import submitit

    from csd.cli import interrupted_message

    lines = [line for line in (job.stderr() or "").splitlines() if line.strip()]
    own = next((line for line in reversed(lines) if line.startswith(OWN_LINES)), None)
    name = f"job #{num} ({' '.join(filter_overrides(overrides))})"
    where = f"its log: {job.paths.stderr}"
    if own is not None and own.startswith("interrupted: "):
        return f"{name} was {own}; {where}"  # it says what is kept and how to resume
    if own is not None:
        return f"{name} failed: {own.removeprefix('error: ')}; {where}"
    if isinstance(err, submitit.core.utils.FailedJobError) and lines:
        stopped = f"failed ({lines[-1].strip()[:200]})"
    else:
        stopped = f"ended without a result (its job state: {job.state})"  # killed, cancelled, timed out, ...
    return f"{name} {stopped}: {interrupted_message(cfg, '', multirun=True)}; {where}"


class OneLineFailures(submitit_launcher.BaseSubmititLauncher):
    """``launch`` of hydra-submitit-launcher 1.2.0 (pinned in pyproject.toml), but for how it collects results."""

    def launch(self, job_overrides: Any, initial_job_idx: int) -> list[JobReturn]:
        import submitit

        assert self.config is not None and self.hydra_context is not None
        num_jobs = len(job_overrides)
        assert num_jobs > 0
        params = self.params
        init_params = {"folder": self.params["submitit_folder"]}
        specific_init_keys = {"max_num_timeout"}
        init_params.update(**{f"{self._EXECUTOR}_{x}": y for x, y in params.items() if x in specific_init_keys})
        init_keys = specific_init_keys | {"submitit_folder"}
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init_params)
        baseparams = set(OmegaConf.structured(BaseQueueConf).keys())
        params = {x if x in baseparams else f"{self._EXECUTOR}_{x}": y for x, y in params.items() if x not in init_keys}
        executor.update_parameters(**params)
        log.info(f"Submitit '{self._EXECUTOR}' sweep output dir : {self.config.hydra.sweep.dir}")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        job_params: list[Any] = []
        for idx, overrides in enumerate(job_overrides):
            idx = initial_job_idx + idx
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*job_params, strict=True))
        # the plugin returns [j.results()[0] for j in jobs]: the first failure's exception, the others unwaited
        failed = [(idx, job, err) for idx, job in enumerate(jobs) if (err := job.exception()) is not None]
        if failed:
            from csd.sweep import job_config

            loader = self.hydra_context.config_loader
            for idx, job, err in failed:
                overrides = list(job_overrides[idx])
                cfg = job_config(loader, self.config, overrides, initial_job_idx + idx)
                print(f"error: {failure_line(initial_job_idx + idx, overrides, cfg, job, err)}", file=sys.stderr)
            raise SystemExit(1)
        return [job.results()[0] for job in jobs]


class LocalLauncher(OneLineFailures, submitit_launcher.LocalLauncher):
    """``hydra/launcher=submitit_local`` with one line per failed job (conf/hydra/launcher/local_procs.yaml)."""


class SlurmLauncher(OneLineFailures, submitit_launcher.SlurmLauncher):
    """``hydra/launcher=submitit_slurm`` with one line per failed job (conf/hydra/launcher/slurm_gpu.yaml)."""
