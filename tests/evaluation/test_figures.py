"""The report's figures of a drafter sweep are readable: short labels under the current key names, legends outside
the axes, no text cut at the figure's edge, panels that keep their width, axis labels on heatmaps, no empty panels.

The sweep is ``python run.py -m method=sjd,csd drafter=chain,pac_tree`` made of fake runs (no AR run, as that
command has none), evaluated with speed, content, the toy's scene checker, CLIP score and regions; every check is on the figure objects.
"""

from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from csd.deprecations import MOVED_TO_DRAFTER
from csd.evaluate import evaluate_run
from csd.report import build_report
from csd.report.collect import results_frame
from csd.report.content_plots import entropy_figure, regions_figure
from csd.report.pareto import NO_AR_HINT, pareto_figure
from csd.toy.domain import heldout_prompts
from tests.evaluation.test_eval_fixtures import eval_cfg, make_run
from tests.evaluation.test_report import fake_result

pytestmark = pytest.mark.slow  # an evaluated sweep and its report (about 16 s), figures of thirteen long labels (5 s)

#: ``method_params`` as chain and pac_tree runs record them (pac_tree: the tree keys under their recorded names)
DRAFTER_PARAMS = {
    "chain": {"window": 16, "init": "random", "coupling": "none", "draft_record": "onehot"},
    "pac_tree": {"window": 64, "init": "random", "coupling": "maximal", "draft_record": "uniform", "tree_width": 4,
                 "tree_depth": 3, "pac_code_parity": False},
}
CSD_PARAMS = {"lam": 0.1, "delta": 0.5, "entropy_norm": "none"}
#: the names the report must not show: recorded names that are deprecated as config keys
DEPRECATED = [old for old, new in MOVED_TO_DRAFTER.items() if old != new]
MAX_LABEL = 30
#: figures of one panel: the data axes keep at least this share of the figure's width (the legend goes elsewhere)
MIN_PANEL_WIDTH = 0.5


@pytest.fixture(scope="module")
def drafter_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four evaluated runs: sjd and csd on the chain and tree drafters, toy scenes as prompts."""
    root = tmp_path_factory.mktemp("sweep")
    metas = [p.meta for p in heldout_prompts(4)]
    cfg = eval_cfg(root.parent / "cfg", **{"eval.metrics": ["speed", "content", "scene", "clip_score", "regions"]})
    for i, (method, drafter) in enumerate(product(("sjd", "csd"), DRAFTER_PARAMS)):
        params = {**DRAFTER_PARAMS[drafter], **(CSD_PARAMS if method == "csd" else {})}
        run = make_run(root / f"{i}_{method}", method, latency=1.0 + 0.3 * i, method_params=params,
                       relaxed_every=4 + i if method == "csd" else 0, metas=metas)
        evaluate_run(run, cfg)
    return root


@pytest.fixture(scope="module")
def figures(drafter_sweep: Path) -> dict[str, Figure]:
    """The report's figures by file name (drawn, kept open)."""
    drawn: dict[str, Figure] = {}
    savefig = Figure.savefig

    def keep(fig: Figure, path: Any, *args: Any, **kwargs: Any) -> None:
        drawn[Path(path).name] = fig
        savefig(fig, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", keep)
        patch.setattr(plt, "close", lambda fig=None: None)
        build_report(drafter_sweep, eval_cfg(drafter_sweep.parent / "cfg"))
    for fig in drawn.values():
        fig.canvas.draw()
    yield drawn
    for fig in drawn.values():
        plt.close(fig)


def texts(fig: Figure) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def data_axes(fig: Figure) -> list[Axes]:
    """The axes that show data (not colour bars, not switched off)."""
    return [ax for ax in fig.axes if ax.axison and not hasattr(ax, "_colorbar")]


def legends(fig: Figure) -> list[Legend]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def test_the_report_draws_every_figure(figures: dict[str, Figure]) -> None:
    assert set(figures) == {"pareto_toy.png", "acceptance_heatmaps_toy.png", "acceptance_vs_entropy_toy.png",
                            "relaxed_by_region_toy.png"}


def test_labels_are_short_and_use_the_current_names(drafter_sweep: Path, figures: dict[str, Figure]) -> None:
    labels = pd.read_csv(drafter_sweep / "report" / "runs.csv")["label"].tolist()
    assert sorted(labels) == ["csd chain", "csd pac_tree", "sjd chain", "sjd pac_tree"]
    for name, fig in figures.items():
        for text in texts(fig):
            assert not any(old in text.get_text() for old in DEPRECATED), (name, text.get_text())
    for fig in figures.values():
        for legend in legends(fig):
            lines = [line for t in legend.get_texts() for line in t.get_text().splitlines()]
            assert max(map(len, lines)) <= MAX_LABEL, lines


def cut_parts(fig: Figure) -> dict[str, tuple[float, ...]]:
    """The parts of ``fig`` that reach past its edge (the saved image's): each axes with its tick labels, axis
    labels and title, the figure's own texts (titles, sup-labels) and its legends."""
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox.padded(1)  # a pixel of rounding
    parts = {f"axes {ax.get_ylabel() or ax.get_xlabel()!r}": ax.get_tightbbox(renderer) for ax in fig.axes}
    parts |= {f"text {t.get_text()!r}": t.get_window_extent(renderer) for t in fig.texts}
    parts |= {f"legend {i}": legend.get_window_extent(renderer) for i, legend in enumerate(legends(fig))}
    return {part: box.bounds for part, box in parts.items() if not _inside(box, frame)}


def covered_axes(fig: Figure) -> list[str]:
    """The data axes a legend overlaps."""
    renderer = fig.canvas.get_renderer()
    return [f"{ax.get_ylabel()!r}" for legend in legends(fig) for ax in data_axes(fig)
            if legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))]


def _inside(box: Bbox, frame: Bbox) -> bool:
    return box.x0 >= frame.x0 and box.y0 >= frame.y0 and box.x1 <= frame.x1 and box.y1 <= frame.y1


@pytest.mark.parametrize("name", ["pareto_toy.png", "acceptance_heatmaps_toy.png", "acceptance_vs_entropy_toy.png",
                                  "relaxed_by_region_toy.png"])
def test_no_text_is_cut_at_the_figure_edge(figures: dict[str, Figure], name: str) -> None:
    fig = figures[name]
    assert not cut_parts(fig), (name, fig.bbox.bounds)
    assert _inside(fig.get_tightbbox(fig.canvas.get_renderer()), Bbox.from_bounds(0, 0, *fig.get_size_inches()).padded(0.01))


@pytest.mark.parametrize("name", ["pareto_toy.png", "acceptance_vs_entropy_toy.png", "relaxed_by_region_toy.png"])
def test_legends_lie_outside_the_data(figures: dict[str, Figure], name: str) -> None:
    fig = figures[name]
    assert len(legends(fig)) == 1
    assert not covered_axes(fig), name


@pytest.mark.parametrize("name", ["acceptance_vs_entropy_toy.png", "relaxed_by_region_toy.png"])
def test_one_panel_figures_keep_the_width_and_a_readable_aspect(figures: dict[str, Figure], name: str) -> None:
    fig = figures[name]
    (ax,) = data_axes(fig)
    box = ax.get_window_extent(fig.canvas.get_renderer())
    assert box.width >= MIN_PANEL_WIDTH * fig.bbox.width
    assert box.height >= 0.4 * box.width  # not a thin strip
    assert ax.get_xlabel() and ax.get_ylabel()


def test_heatmaps_say_what_their_axes_are(figures: dict[str, Figure]) -> None:
    fig = figures["acceptance_heatmaps_toy.png"]
    assert fig.get_supxlabel() and fig.get_supylabel()
    bars = [ax for ax in fig.axes if hasattr(ax, "_colorbar")]
    assert bars and all(ax.get_xlabel() for ax in bars)  # each colour bar (under its column) says its unit


def test_pareto_without_an_ar_run_draws_only_panels_with_data(figures: dict[str, Figure]) -> None:
    fig = figures["pareto_toy.png"]
    panels = data_axes(fig)
    assert panels and all(ax.get_xlabel() == "step compression" for ax in panels)
    assert all(ax.collections for ax in panels)  # every panel has its runs' points
    notes = [t for t in texts(fig) if "eval.report.extra_runs" in t.get_text()]
    assert len(notes) == 1 and NO_AR_HINT in notes[0].get_text()  # one note, not a panel per quality


def test_long_labels_of_a_grid_sweep_fit_every_figure() -> None:
    # twelve CSD runs on the tree, three knobs swept: long labels, a legend of many entries
    grid = [fake_result("csd", 1.0 + 0.05 * i, tree_width=4, tree_depth=3, pac_code_parity=False, lam=0.05 * i,
                        delta=0.3 + 0.1 * (i % 3), entropy_norm="log_vocab" if i % 2 else "none") for i in range(12)]
    df = results_frame([fake_result("ar", 2.0), *grid])
    labels = df["label"].tolist()
    assert max(map(len, labels)) > 40  # longer than a legend's line: wrapped, not cut
    curve = {"edges": [0.0, 1.0, 2.0, 3.0], "accepted": [0.6, 0.4, 0.1], "relaxed": [0.0, 0.05, 0.02]}
    region = {reg: {"relaxed_rate": rate} for reg, rate in zip(("object", "smooth", "textured"), (0.01, 0.02, 0.03),
                                                                  strict=True)}
    figs = [pareto_figure(df, ["speedup", "step_compression"], ["fid", "clip_score"], "toy"),
            entropy_figure([(label, curve) for label in labels]), regions_figure([(label, region) for label in labels])]
    for fig in figs:
        fig.canvas.draw()
        assert not cut_parts(fig), fig.bbox.bounds
        assert not covered_axes(fig)
        lines = [line for t in legends(fig)[0].get_texts() for line in t.get_text().splitlines()]
        assert max(map(len, lines)) <= MAX_LABEL
        plt.close(fig)
