"""Commands that re-run on committed results write elsewhere by default: the benchmarks into the untracked
``runs/bench/``, the report stage's Hydra files (``.hydra/``, ``run.log``) into ``runs/report/<time>``."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_latency, bench_throughput
from run import output_dir


def test_benchmarks_write_to_an_untracked_dir_unless_told() -> None:
    for bench in (bench_latency, bench_throughput):
        assert bench.parse_args([]).out == Path("runs/bench")
        assert bench.parse_args(["--out", "results/bench"]).out == Path("results/bench")


def test_report_stage_keeps_hydra_files_out_of_the_sweep_dir() -> None:
    new, log_dir = "runs/toy/toy/csd/now", "runs/report/now"
    for sweep_dir, run_dir in (("results/toy_paper", None), (None, "results/toy_paper/9_csd")):
        assert output_dir("report", run_dir, sweep_dir, new, log_dir) == log_dir
    assert output_dir("report", None, None, new, log_dir) == new  # a new run reported in place (stage=report alone)
    assert output_dir("evaluate", "r", None, new, log_dir) == "r"
    assert output_dir("status", None, "s", new, log_dir) == "s"
