"""The one GPU check command (experiments/gpu_check.py) in its CPU smoke form: every part runs on the tiny Janus and
lands in the results files next to the targets, and a failing part is recorded while the others run on."""

from __future__ import annotations

import dataclasses
import json

import pytest

from experiments import gpu_check, rule_exactness


@pytest.mark.slow
def test_smoke_run_measures_every_part(tmp_path):
    res = gpu_check.main(["--smoke", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_check_janus_pro_tiny_cpu.json").read_text())
    assert list(saved["parts"]) == ["model", *gpu_check.PARTS]
    assert all(part["ok"] for part in saved["parts"].values()), {k: v.get("error") for k, v in saved["parts"].items()}
    parts = {name: part["result"] for name, part in res["parts"].items()}
    assert parts["agreement"]["ar"]["equal_share"] == 1.0  # fp32 on CPU: the compiled path's tokens are the eager ones
    assert parts["agreement"]["sjd"]["nfe_eager"] == parts["agreement"]["sjd"]["nfe_compiled"]
    assert set(parts["throughput"]["batches"]) == {1, 4, 16}
    # the timed images replay graphs compiled by their warm-up image: no compilation inside a latency
    assert [parts["images"][name]["graphs_compiled_while_timed"] for name in ("ar", "sjd", "csd")] == [0, 0, 0]
    assert all(parts["images"][name]["outside_step_share"] < 1 for name in ("ar", "sjd", "csd"))
    assert parts["memory"]["plan_gb"] > parts["memory"]["plan_weights_gb"] > 0
    assert parts["exactness"]["min_equal_share"] == 1.0  # compiled = eager in fp32, batch 1 and B = 3
    assert parts["rules"]["equal_share"] == 1.0 and set(parts["rules"]["rules"]) == set(rule_exactness.rule_presets())
    calls = parts["host_calls"]
    assert set(calls) == {"compiled x + 1", "noise draw", "judge, compiled", "judge, eager"}
    assert all(r["warm"] > 0 and r["after forward"] > 0 for r in calls.values())
    top = parts["kernels"]["top"]
    assert top and parts["kernels"]["self_ms_per_step"] > 0 and sum(k["share"] for k in top) <= 1 + 1e-9
    assert any("mm" in k["name"] for k in top)  # the step's matrix products are among its heaviest operators
    assert [t["measured"] is not None for t in saved["targets"]] == [True] * len(gpu_check.TARGETS)
    assert [t["passed"] for t in saved["targets"]] == [None] * len(gpu_check.TARGETS)  # smoke: not judged
    table = (tmp_path / "gpu_check_janus_pro_tiny_cpu.md").read_text()
    assert "| AR step (7B), compiled, q = 1 |" in table and "<= 4.0 ms" in table and ">= 4.0 x" in table
    assert table.count(f"| {gpu_check.NOT_JUDGED} |") == len(gpu_check.TARGETS)


def test_a_failing_part_is_recorded_and_the_check_goes_on(tmp_path, monkeypatch):
    def broken(check):
        raise RuntimeError("forced failure")

    monkeypatch.setitem(gpu_check.RUNNERS, "floor", broken)
    res = gpu_check.main(["--smoke", "--parts", "floor,memory,overhead", "--out", str(tmp_path)])
    parts = json.loads((tmp_path / "gpu_check_janus_pro_tiny_cpu.json").read_text())["parts"]
    assert parts["floor"]["ok"] is False and parts["floor"]["error"] == "RuntimeError: forced failure"
    assert parts["floor"]["traceback"]
    assert parts["memory"]["error"] == "RuntimeError: needs the throughput part, which did not succeed"
    assert parts["overhead"]["ok"] and res["parts"]["overhead"]["result"]["verify_csd_ms"] > 0
    assert "**failed**: RuntimeError: forced failure" in (tmp_path / "gpu_check_janus_pro_tiny_cpu.md").read_text()


def test_unknown_parts_are_one_line(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--parts", "floor,warp"])
    assert "--parts: unknown ['warp']" in capsys.readouterr().err


def test_parts_past_the_time_budget_are_skipped_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "SMOKE", dataclasses.replace(gpu_check.SMOKE, budget_s=0.0))
    parts = gpu_check.main(["--smoke", "--parts", "floor,overhead", "--out", str(tmp_path)])["parts"]
    assert parts["model"]["ok"]
    for name in ("floor", "overhead"):
        assert not parts[name]["ok"] and parts[name]["error"].startswith("skipped: "), parts[name]


def targets_table(smoke: bool) -> str:
    """The summary of a check whose every target was measured and missed, as a smoke run or a full one."""
    results = {"steps": {"result": {"compiled": {"q1": {"median_ms": 9.0}}, "compiled_verify_over_step": 2.0}},
               "overhead": {"result": {"csd_overhead_ms": 1.0}}, "throughput": {"result": {"largest_over_first": 1.0}},
               "exactness": {"result": {"min_equal_share": 0.5}}, "rules": {"result": {"equal_share": 0.875}}}
    meta = {"model": "janus_pro_tiny", "dtype": "float32", "device_name": "cpu", "smoke": smoke, "torch": "x", "transformers": "x",
            "window": 32, "backend": "aot_eager", "wall_s": 1.0}
    res = {"meta": meta, "targets": [t.judge(results, judged=not smoke) for t in gpu_check.TARGETS], "parts": {}}
    count = len(gpu_check.TARGETS)
    assert [t["passed"] for t in res["targets"]] == ([None] * count if smoke else [False] * count)
    return gpu_check.markdown(res)


def test_a_smoke_run_judges_no_target_and_its_table_says_so() -> None:
    smoke = targets_table(smoke=True)
    assert "targets not judged" in smoke
    rows = [line for line in smoke.splitlines() if line.startswith("| ") and ("<=" in line or ">=" in line)]
    assert len(rows) == len(gpu_check.TARGETS) and all(row.endswith("| not judged |") for row in rows), rows
    assert "False" not in smoke and "True" not in smoke
    full = targets_table(smoke=False)
    assert "not judged" not in full and full.count("| False |") == len(gpu_check.TARGETS)


def test_a_run_killed_midway_keeps_the_parts_it_finished(tmp_path, monkeypatch):
    """The results are written after every part: a run stopped at its time limit (here: interrupted inside a part)
    leaves the parts before it on disk."""
    def interrupted(check):
        raise KeyboardInterrupt

    monkeypatch.setitem(gpu_check.RUNNERS, "overhead", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--smoke", "--parts", "floor,overhead", "--out", str(tmp_path)])
    parts = json.loads((tmp_path / "gpu_check_janus_pro_tiny_cpu.json").read_text())["parts"]
    assert parts["floor"]["ok"] and "overhead" not in parts


def test_a_derived_part_runs_past_the_budget(tmp_path, monkeypatch):
    """memory only reads the throughput part's peak: it is never skipped (here it reports the missing throughput)."""
    monkeypatch.setattr(gpu_check, "SMOKE", dataclasses.replace(gpu_check.SMOKE, budget_s=0.0))
    parts = gpu_check.main(["--smoke", "--parts", "floor,memory", "--out", str(tmp_path)])["parts"]
    assert parts["floor"]["error"].startswith("skipped: ")
    assert parts["memory"]["error"] == "RuntimeError: needs the throughput part, which did not succeed"
