"""Commands that re-run on committed results write elsewhere by default: the benchmarks into the untracked
``runs/bench/``, the report and status stages' Hydra files (``.hydra/``, ``run.log``) into ``runs/<stage>/<time>``."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_latency, bench_throughput
from run import output_dir


def test_benchmarks_write_to_an_untracked_dir_unless_told() -> None:
    for bench in (bench_latency, bench_throughput):
        assert bench.parse_args([]).out == Path("runs/bench")
        assert bench.parse_args(["--out", "results/bench"]).out == Path("results/bench")


def test_report_and_status_keep_hydra_files_out_of_the_dirs_they_read() -> None:
    new, log_dir = "runs/toy/toy/csd/now", "runs/<stage>/now"
    for stage in ("report", "status"):
        for sweep_dir, run_dir in (("results/toy_paper", None), (None, "results/toy_paper/9_csd")):
            assert output_dir(stage, run_dir, sweep_dir, new, log_dir) == log_dir
    assert output_dir("report", None, None, new, log_dir) == new  # a new run reported in place (stage=report alone)
    assert output_dir("evaluate", "r", None, new, log_dir) == "r"
    assert output_dir("study", None, "s", new, log_dir) == "s"  # the study writes into its directory
