"""The report stage: tables, Pareto plots and content-awareness plots for a sweep or a list of runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from csd.evaluation import METRICS_FILE
from csd.report.collect import DEFAULT_RESAMPLES, find_run_dirs, load_run, results_frame
from csd.report.content_plots import entropy_figure, heatmap_figure, regions_figure, save
from csd.report.html import DEFAULT_PROMPTS, write_html
from csd.report.pareto import PARETO_Y, plot_pareto
from csd.report.published import write_published
from csd.report.table import paper_order, write_tables

log = logging.getLogger(__name__)


def report_dir(source: Path | Sequence[Path], cfg: DictConfig) -> Path:
    """``eval.report.out_dir`` if set, else ``<sweep or run dir>/report``, else ``<common parent>/report``."""
    configured = OmegaConf.select(cfg, "eval.report.out_dir")
    if configured:
        return Path(configured)
    if isinstance(source, (str, Path)):
        return Path(source) / "report"
    parents = {Path(p).resolve().parent for p in source}
    base = Path(source[0]) if len(source) == 1 else (parents.pop() if len(parents) == 1 else Path.cwd())
    return base / "report"


def build_report(run_dirs_or_sweep_dir: Path | list[Path], cfg: DictConfig) -> Path:
    """Write ``runs.csv``, per-model tables (CSV + Markdown), Pareto and content plots, ``report.md`` and the page
    ``index.html`` (:mod:`csd.report.html`: the tables, figures and ``eval.report.html_prompts`` prompts' images).

    Reads each run's ``metrics.json`` and ``per_image.jsonl``, and its records to check that the metrics still
    describe them (runs not evaluated, with a broken file or with stale metrics are skipped with a warning),
    plus the runs listed in ``eval.report.extra_runs`` (e.g. an AR baseline); a ``published`` block (a paper's numbers,
    :mod:`csd.report.published`) gives ``published_<model>_<dataset>`` tables beside ours; paired comparisons with the AR run
    use ``eval.bootstrap`` prompt resamples. Returns the report directory.
    """
    extra = [Path(p) for p in OmegaConf.select(cfg, "eval.report.extra_runs", default=None) or []]
    dirs = find_run_dirs(run_dirs_or_sweep_dir) + extra
    results = [r for r in map(load_run, dirs) if r is not None]
    if not results:
        evaluated = sum((d / METRICS_FILE).exists() for d in dirs)
        if evaluated:
            raise FileNotFoundError(
                f"no usable metrics.json under {run_dirs_or_sweep_dir}: {evaluated} left out "
                "(see the warnings above)"
            )
        raise FileNotFoundError(f"no evaluated runs (metrics.json) under {run_dirs_or_sweep_dir}")
    out = report_dir(run_dirs_or_sweep_dir, cfg)
    out.mkdir(parents=True, exist_ok=True)
    df = results_frame(results, OmegaConf.select(cfg, "eval.bootstrap", default=DEFAULT_RESAMPLES))
    df.to_csv(out / "runs.csv", index=False)
    sections = [p.read_text(encoding="utf-8") for p in write_tables(df, out)]
    published = OmegaConf.to_container(OmegaConf.select(cfg, "published", default=None) or OmegaConf.create({}))
    sections += [p.read_text(encoding="utf-8") for p in write_published(df, published, out)]
    xs = list(OmegaConf.select(cfg, "eval.report.pareto_x", default=["speedup", "step_compression"]))
    ys = list(OmegaConf.select(cfg, "eval.report.pareto_y", default=PARETO_Y))
    model_figures = {}
    for model, group in df.groupby("model"):
        figures = [plot_pareto(group, xs, ys, f"{model}: speed vs quality", out / f"pareto_{model}.png")]
        runs = [(row["label"], results[i]) for i, row in paper_order(group).iterrows()]  # the table's order
        figures += _content(model, runs, out)
        model_figures[str(model)] = figures
        sections.append("\n".join(f"![{p.stem}]({p.name})" for p in figures) + "\n")
    (out / "report.md").write_text("# csd-bench report\n\n" + "\n".join(sections), encoding="utf-8")
    n_prompts = OmegaConf.select(cfg, "eval.report.html_prompts", default=DEFAULT_PROMPTS)
    write_html(df, results, out, DEFAULT_PROMPTS if n_prompts is None else n_prompts, model_figures)
    log.info("report: %d runs -> %s", len(df), out)
    return out


def _content(model: str, runs: list[tuple[str, dict]], out: Path) -> list[Path]:
    """Heatmaps, acceptance-vs-entropy and (toy) region plots of the runs that recorded them."""
    figs = []
    maps = [(label, r["content"]["acceptance_maps"]) for label, r in runs if "acceptance_maps" in r["content"]]
    if maps:
        figs.append(save(heatmap_figure(maps), out / f"acceptance_heatmaps_{model}.png"))
    curves = [(label, r["content"]["acceptance_by_entropy"]) for label, r in runs if "acceptance_by_entropy" in r["content"]]
    if curves:
        figs.append(save(entropy_figure(curves), out / f"acceptance_vs_entropy_{model}.png"))
    regions = [(label, r["content"]["regions"]) for label, r in runs if "regions" in r["content"]]
    if regions:
        figs.append(save(regions_figure(regions), out / f"relaxed_by_region_{model}.png"))
    return figs
