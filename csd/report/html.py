"""The report as one self-contained page, ``<report>/index.html``: per model the compact table (sortable by any
column, the full table folded under it), the Pareto figure, the protocol card, a section per run, and a per-prompt
comparison of every run's image with AR's for a few chosen prompts, each beside its acceptance map (the iteration
and the kind of commit of every token).

Everything is inline (CSS, a few lines of JS, images as base64 data URIs): the page opens offline, from any folder,
with no server. Only the chosen prompts' images are on it (``eval.report.html_prompts``), decoded from the records'
tokens where the run has no PNG (:class:`csd.decode.RunImages`); the page of the 12-run, 400-prompt toy sweep
weighs well under a megabyte. An image larger than :data:`THUMB` px is on it as a thumbnail that links to the run's PNG
(a relative path: it opens while the page and the run directories keep their places). The other figures of the
report stay next to it and are linked.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from PIL import Image

from csd.adapters.base import ModelAdapter
from csd.decode import RUN_INFO_FILE, RunImages, load_run_adapter, run_device, run_model_config
from csd.evaluation.content import on_grid
from csd.records import COMMIT_ACCEPTED, COMMIT_FORCED, COMMIT_RELAXED, COMMIT_SAMPLED, load_records
from csd.report.collect import AR_METHOD
from csd.report.table import (
    COLUMNS,
    NOTE_INTERVALS,
    compact_cells,
    full_cells,
    main_quality,
    paper_order,
    table_context,
)

log = logging.getLogger(__name__)
HTML_FILE = "index.html"
#: prompts compared image by image when the config names no number
DEFAULT_PROMPTS = 16
#: images wider or taller than this are shrunk to it and embedded as JPEG, linked to their PNG (a real model's 384-1024
#: px images); smaller ones (the toy's) are embedded as they are, as PNG
THUMB = 256
JPEG_QUALITY = 85
#: how the page shows an image and its maps (CSS pixels; small images are scaled up without smoothing)
SHOW_PX = 128
MAP_PX = 64
#: commit kind -> (name, RGB) of the acceptance maps and their legend
KINDS = {
    COMMIT_SAMPLED: ("sampled", (200, 200, 200)),
    COMMIT_ACCEPTED: ("accepted", (31, 119, 180)),
    COMMIT_RELAXED: ("relaxed", (255, 127, 14)),
    COMMIT_FORCED: ("forced", (0, 0, 0)),
}
#: the committing iteration's colour ramp, first to last iteration of the image (viridis' ends and middle)
RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
#: per-image quality shown under an image and used to choose prompts: (per_image.jsonl column, caption name),
#: the first one the runs have (the toy's scene checker, GenEval's verdict, else CLIP score)
PER_IMAGE = (("scene_overall", "scene"), ("geneval_correct", "GenEval"), ("clip_score", "CLIP"))

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
h1,h2,h3{font-weight:600}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.2em .5em;text-align:left}
table.sortable th{cursor:pointer;background:#f3f3f3;user-select:none}
table.sortable th:hover{background:#e4e4e4}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.num{font-variant-numeric:tabular-nums}
.note{color:#555;font-size:12px;max-width:100em}
img.pixel{image-rendering:pixelated}
.figure{max-width:min(100%,900px)}
.card td:first-child{font-weight:600;white-space:nowrap}
.prompt{margin:1em 0;padding:.5em;border:1px solid #ddd;border-radius:4px}
.prompt-row{display:flex;flex-wrap:wrap;gap:10px}
.tile{margin:0;display:flex;flex-direction:column;width:""" + str(SHOW_PX + MAP_PX + 6) + """px;font-size:11px}
.tile .pics{display:flex;gap:4px;align-items:flex-start}
.tile figcaption{margin-top:2px}
.tile.ar{background:#f6f6f6}
.bad{color:#b00}.good{color:#070}
.legend span.sw{display:inline-block;width:12px;height:12px;border:1px solid #888;vertical-align:middle;margin:0 3px 0 10px}
.legend span.ramp{display:inline-block;width:120px;height:12px;vertical-align:middle;margin:0 4px;border:1px solid #888}
.missing{width:""" + str(SHOW_PX) + """px;height:""" + str(SHOW_PX) + """px;background:#eee;color:#777;font-size:11px}
"""

#: sorts a table by the clicked column: numbers by value (the value of "0.75 [0.71, 0.79]" is 0.75), other text
#: alphabetically, empty cells last either way; a second click reverses
JS = """
(function () {
  function key(row, col) {
    var cell = row.cells[col];
    var text = cell ? (cell.getAttribute('data-sort') || cell.textContent).trim() : '';
    if (text === '') return null;
    var num = parseFloat(text);
    return isNaN(num) ? text.toLowerCase() : num;
  }
  function compare(a, b) {
    if (typeof a === typeof b) return a < b ? -1 : a > b ? 1 : 0;
    return typeof a === 'number' ? -1 : 1;
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener('click', function () {
        var up = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', up ? 'ascending' : 'descending');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var ka = key(a, col), kb = key(b, col);
          if (ka === null || kb === null) return (ka === null) - (kb === null);
          return up ? compare(ka, kb) : compare(kb, ka);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
})();
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def data_uri(image: Image.Image) -> str:
    """``image`` as a data URI: PNG up to :data:`THUMB` pixels a side, else shrunk to it and JPEG."""
    buffer = io.BytesIO()
    if max(image.size) <= THUMB:
        image.save(buffer, format="PNG", optimize=True)
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    image = image.convert("RGB")
    image.thumbnail((THUMB, THUMB), Image.LANCZOS)
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def file_uri(path: Path) -> str:
    """A PNG file as a data URI, as it is (the report's figures)."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def commit_layout(record: dict[str, Any], field: str) -> np.ndarray:
    """A per-position field of a record laid out as the image: on the token grid; when forced positions (e.g. the
    end-of-line tokens of Lumina-mGPT) make the positions a whole number of rows, with them in place, so they show;
    otherwise without them (:func:`csd.evaluation.content.on_grid`)."""
    rows, cols = record["grid"]
    values = np.asarray(record[field])
    if values.size == rows * cols or (values.size % rows == 0 and values.size > rows * cols):
        return values.reshape(rows, -1)
    return on_grid(record, field)


def ramp(x: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> RGB ``uint8`` on :data:`RAMP`."""
    anchors = np.asarray(RAMP, dtype=float)
    at = np.linspace(0, 1, len(anchors))
    return np.stack([np.interp(x, at, anchors[:, c]) for c in range(3)], axis=-1).round().astype(np.uint8)


def acceptance_map(record: dict[str, Any]) -> Image.Image:
    """One image's acceptance map, one pixel per token: on top the iteration that committed each token (first to
    last iteration of this image, :data:`RAMP`), under it, after a white row, how it was committed (:data:`KINDS`)."""
    iters = commit_layout(record, "commit_iter").astype(float)
    kinds = commit_layout(record, "commit_kind")
    top = ramp(iters / max(iters.max(), 1.0))
    bottom = np.zeros((*kinds.shape, 3), dtype=np.uint8)
    for kind, (_, colour) in KINDS.items():
        bottom[kinds == kind] = colour
    gap = np.full((1, kinds.shape[1], 3), 255, dtype=np.uint8)
    return Image.fromarray(np.concatenate([top, gap, bottom]))


def per_image_metric(results: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """The first of :data:`PER_IMAGE` that a run's ``per_image.jsonl`` has a value of."""
    for column, name in PER_IMAGE:
        if any(row.get(column) is not None for res in results for row in res.get("per_image") or []):
            return column, name
    return None


def _value(row: dict[str, Any] | None, column: str) -> float | None:
    value = None if row is None else row.get(column)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def choose_prompts(results: Sequence[dict[str, Any]], ar: int | None, column: str | None,
                   n: int) -> list[tuple[str, int]]:
    """``n`` (prompt_id, sample) images to compare: the first half of them in prompt order, then those where the
    runs' per-image ``column`` differs most from AR's (the sum over runs of the absolute differences; without an AR
    run, the spread between runs), ties in prompt order; the first images again when fewer differ at all."""
    base = results[ar] if ar is not None else results[0]
    keys = [(r["prompt_id"], r["sample"]) for r in base.get("per_image") or []]
    if not keys or n <= 0:
        return []
    chosen = keys[: (n + 1) // 2]
    if column is not None:
        tables = [{(r["prompt_id"], r["sample"]): r for r in res.get("per_image") or []} for res in results]
        scores = []
        for i, key in enumerate(keys):
            values = [_value(t.get(key), column) for t in tables]
            if ar is not None:
                ref = values[ar]
                score = 0.0 if ref is None else sum(abs(v - ref) for v in values if v is not None)
            else:
                present = [v for v in values if v is not None]
                score = max(present) - min(present) if present else 0.0
            scores.append((-score, i, key))
        chosen += [key for score, _, key in sorted(scores) if score < 0 and key not in chosen][: n - len(chosen)]
    chosen += [key for key in keys if key not in chosen][: n - len(chosen)]
    return chosen


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "run"


def run_anchors(results: Sequence[dict[str, Any]]) -> list[str]:
    """A unique ``id`` per run, from its directory's name."""
    anchors: list[str] = []
    for res in results:
        anchor = base = "run-" + slug(Path(res["run_dir"]).name)
        k = 2
        while anchor in anchors:
            anchor, k = f"{base}-{k}", k + 1
        anchors.append(anchor)
    return anchors


def _table(frame: pd.DataFrame, table_id: str, links: Sequence[str] | None = None) -> str:
    """A sortable table of ``frame``'s cells; ``links``: the anchor of each row's run, linked from its first cell."""
    head = "".join(f'<th scope="col" title="sort by {esc(c)}">{esc(c)}</th>' for c in frame.columns)
    body = []
    for i, row in enumerate(frame.itertuples(index=False)):
        cells = []
        for j, value in enumerate(row):
            text = "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
            if isinstance(text, float):
                text = f"{text:.3g}"
            inner = f'<a href="#{links[i]}">{esc(text)}</a>' if links is not None and j == 0 else esc(text)
            cls = ' class="num"' if j > 0 else ""
            cells.append(f"<td{cls}>{inner}</td>")
        attr = f' data-run="{links[i]}"' if links is not None else ""
        body.append(f"<tr{attr}>{''.join(cells)}</tr>")
    return (f'<table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _notes(notes: Sequence[str]) -> str:
    return "".join(f'<p class="note">{esc(note).replace("`", "")}</p>' for note in notes)


def protocol_card(group: pd.DataFrame, members: Sequence[dict[str, Any]]) -> str:
    """Model, datasets, prompts and images, metrics and what computed them, seeds, versions and commit."""
    infos = [_run_info(Path(res["run_dir"])) for res in members]
    measured = [header for column, header in COLUMNS.items()
                if column in group and group[column].notna().any() and column not in ("label", "lam", "delta")]
    evaluators: dict[str, set[str]] = {}
    for res in members:
        for key, value in _flat(res.get("protocol") or {}).items():
            evaluators.setdefault(key, set()).add(value)
    skipped = sorted({f"{name}: {why}" for res in members for name, why in (res.get("skipped") or {}).items()})
    commits = sorted({str(c) for info in infos for c in [info.get("commit") or info.get("git_commit")] if c})
    versions = sorted({f"{k} {v}" for info in infos for k, v in (info.get("versions") or {}).items()})
    seeds = sorted({str(res["run"].get("seed")) for res in members})
    rows = [
        ("model", ", ".join(sorted(group["model"].unique()))),
        ("dataset", table_context(group)),
        ("prompts", ", ".join(str(int(n)) for n in sorted(group["n_prompts"].dropna().unique())) or "not recorded"),
        ("images per run", ", ".join(str(int(n)) for n in sorted(group["n_images"].dropna().unique()))),
        ("runs", str(len(group))),
        ("seed", ", ".join(seeds) + " (each image's own seed is in its record; the images compared below share "
                                   "prompt, sample and seed)"),
        ("metrics", ", ".join(measured)),
    ]
    for key, values in evaluators.items():
        rows.append((f"protocol: {key}", " | ".join(sorted(values)) + (" (differs between runs)" if len(values) > 1
                                                                        else "")))
    if any("scene_acc_overall" in res.get("metrics", {}) for res in members):
        rows.append(("protocol: scene", "the toy's scene checker (rendered scenes: object, colour, count, position)"))
    if skipped:
        rows.append(("skipped", "; ".join(skipped)))
    rows.append(("versions", ", ".join(versions) or "not recorded"))
    rows.append(("commit", ", ".join(commits) or "not recorded by these runs"))
    body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="card">{body}</table>'


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a.b": "value"}`` of a nested dict (``metrics.json``'s ``protocol``)."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else str(value)
    return out


def _run_info(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def run_section(res: dict[str, Any], label: str, anchor: str, table_id: str) -> str:
    """A run's directory, parameters and every metric of its ``metrics.json`` with its interval."""
    intervals = res.get("intervals") or {}
    rows = []
    for name, value in (res.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and value is not None and not (isinstance(value, float) and math.isnan(value)):
            lo_hi = intervals.get(name)
            text = f"{value:.4g}" + (f" [{lo_hi[0]:.4g}, {lo_hi[1]:.4g}]" if lo_hi else "")
            rows.append(f"<tr><td>{esc(name)}</td><td>{esc(text)}</td></tr>")
    params = json.dumps(res["run"].get("method_params") or {}, sort_keys=True)
    return (f'<section id="{anchor}"><h3>{esc(label)}</h3>'
            f'<p>run: <code>{esc(res["run_dir"])}</code>; method <code>{esc(res["run"]["method"])}</code>, '
            f"parameters <code>{esc(params)}</code>; images: {esc(res['run'].get('n_records'))} "
            f'(<a href="#{table_id}">back to the table</a>)</p>'
            f"<details><summary>all metrics</summary><table>{''.join(rows)}</table></details></section>")


def legend() -> str:
    kinds = "".join(f'<span class="sw" style="background:rgb{colour}"></span>{esc(name)}'
                    for name, colour in KINDS.values())
    stops = ",".join(f"rgb{c}" for c in RAMP)
    return (f'<p class="legend">Acceptance map, beside each image, one cell per token: on top the iteration that '
            f'committed the token, first <span class="ramp" style="background:linear-gradient(to right,{stops})">'
            f"</span> last iteration of that image; under it how it was committed:{kinds}.</p>")


def _caption(res: dict[str, Any], key: tuple[str, int], metric: tuple[str, str] | None,
             record: dict[str, Any] | None) -> str:
    row = next((r for r in res.get("per_image") or [] if (r["prompt_id"], r["sample"]) == key), None)
    parts = []
    if record is not None:
        parts.append(f"NFE {record['nfe']}, ×{record['step_compression']:.2f}")
    if metric is not None and row is not None and row.get(metric[0]) is not None:
        value = row[metric[0]]
        if isinstance(value, bool):
            parts.append(f'<span class="{"good" if value else "bad"}">{metric[1]} {"✓" if value else "✗"}</span>')
        else:
            parts.append(f"{metric[1]} {float(value):.2f}")
    return ", ".join(parts)


class SharedImages(RunImages):
    """:class:`csd.decode.RunImages` whose model is built once for all the runs of one model config and device
    (``adapters``), not once per run: a sweep's runs share their model."""

    def __init__(self, run_dir: Path, records: Sequence[dict[str, Any]],
                 adapters: dict[tuple[str, str], ModelAdapter]) -> None:
        super().__init__(run_dir, records)
        self.adapters = adapters

    @cached_property
    def adapter(self) -> ModelAdapter:
        key = (OmegaConf.to_yaml(run_model_config(self.run_dir)), str(run_device(self.run_dir, self.device)))
        if key not in self.adapters:
            self.adapters[key] = load_run_adapter(self.run_dir, self.device)
        return self.adapters[key]


def sample_tile(images: RunImages, record: dict[str, Any], label: str, out: Path) -> str:
    """One run's image of a prompt: embedded (:func:`data_uri`); an image larger than :data:`THUMB` is embedded as its
    thumbnail, linked to the run's PNG (a path relative to the page in ``out``) when the run has that file."""
    image = Image.fromarray(images.array(record))
    tag = (f'<img class="sample pixel" src="{data_uri(image)}" width="{SHOW_PX}" height="{SHOW_PX}" '
           f'alt="{esc(label)}">')
    png = images.run_dir / record["image"]
    if max(image.size) <= THUMB or not png.is_file():
        return tag
    href = Path(os.path.relpath(png.resolve(), out.resolve())).as_posix()
    return (f'<a class="full" href="{esc(href)}" title="full size: {image.width} x {image.height} px">'
            f"{tag}</a>")


def comparison(group_results: Sequence[tuple[str, str, dict[str, Any]]], keys: Sequence[tuple[str, int]],
               metric: tuple[str, str] | None, out: Path) -> str:
    """One block per chosen image: its prompt, then each run's image (AR first) with its acceptance map and a
    caption (label, NFE, step compression, the per-image metric); a large image is a thumbnail linking to its file
    (:func:`sample_tile`)."""
    wanted = set(keys)
    adapters: dict[tuple[str, str], ModelAdapter] = {}
    per_run = []
    for label, anchor, res in group_results:
        run_dir = Path(res["run_dir"])
        records = {(r["prompt_id"], r["sample"]): r for r in load_records(run_dir, keys=wanted)}
        per_run.append((label, anchor, res, records, SharedImages(run_dir, list(records.values()), adapters)))
    blocks = []
    broken: set[str] = set()
    for key in keys:
        prompt = next((recs[key] for *_, recs, _ in per_run if key in recs), None)
        title = (f"{esc(key[0])}, sample {key[1]}" + (f", seed {prompt['seed']}: {esc(prompt['prompt'])}"
                                                       if prompt else ""))
        tiles = []
        for label, anchor, res, records, images in per_run:
            record = records.get(key)
            pic, amap = '<div class="missing">not in this run</div>', ""
            if record is not None and res["run_dir"] in broken:
                pic = '<div class="missing">image not decoded</div>'
            elif record is not None:
                try:
                    pic = sample_tile(images, record, label, out)
                except Exception as err:  # a model that cannot be built here: the page without the run's images
                    log.warning("%s: images not decoded for the HTML report (%s)", res["run_dir"], err)
                    broken.add(res["run_dir"])
                    pic = f'<div class="missing">image not decoded: {esc(type(err).__name__)}</div>'
            if record is not None:
                try:
                    amap_image = acceptance_map(record)
                    height = round(MAP_PX * amap_image.height / amap_image.width)
                    amap = (f'<img class="amap pixel" src="{data_uri(amap_image)}" width="{MAP_PX}" '
                            f'height="{height}" alt="acceptance map" title="commit iteration (top), kind (bottom)">')
                except (KeyError, ValueError) as err:
                    amap = f'<div class="missing">no acceptance map: {esc(err)}</div>'
            ar = " ar" if res["run"]["method"] == AR_METHOD else ""
            tiles.append(f'<figure class="tile{ar}"><div class="pics">{pic}{amap}</div><figcaption>'
                         f'<a href="#{anchor}">{esc(label)}</a><br>{_caption(res, key, metric, record)}'
                         f"</figcaption></figure>")
        blocks.append(f'<div class="prompt"><h4>{title}</h4><div class="prompt-row" data-prompt="{esc(key[0])}" '
                      f'data-sample="{key[1]}">{"".join(tiles)}</div></div>')
    return "".join(blocks)


def write_html(df: pd.DataFrame, results: Sequence[dict[str, Any]], out: Path, n_prompts: int = DEFAULT_PROMPTS,
               figures: dict[str, Sequence[Path]] | None = None) -> Path:
    """``<out>/index.html`` for the runs of ``df`` (:func:`csd.report.collect.results_frame`, rows in the order of
    ``results``); ``figures``: each model's report figures, the first (its Pareto plot) embedded, the rest linked.
    Returns its path."""
    figures = figures or {}
    anchors = run_anchors(results)
    toc, sections = [], []
    for model, group in df.groupby("model"):
        ordered = paper_order(group)
        members = [(row["label"], anchors[i], results[i]) for i, row in ordered.iterrows()]
        table_id = f"table-{slug(str(model))}"
        toc.append(f'<li><a href="#model-{slug(str(model))}">{esc(model)}</a></li>')
        compact, flags = compact_cells(group, delta=True)
        full, full_notes = full_cells(group)
        links = [anchor for _, anchor, _ in members]
        parts = [f'<h2 id="model-{slug(str(model))}">{esc(model)} <small>({esc(table_context(group))})</small></h2>',
                 "<p>Click a column's header to sort by it (again: reversed); a method links to its run.</p>",
                 _table(compact, table_id, links), _notes([NOTE_INTERVALS, *flags]),
                 f"<details><summary>full table</summary>{_table(full, table_id + '-full', links)}"
                 f"{_notes(full_notes)}</details>"]
        model_figures = list(figures.get(str(model), []))
        if model_figures:
            parts.append(f'<h3>Pareto fronts</h3><img class="figure" src="{file_uri(model_figures[0])}" '
                         f'alt="{esc(model_figures[0].stem)}">')
        if model_figures[1:]:
            parts.append("<p>More figures (next to this page): " + ", ".join(
                f'<a href="{esc(p.name)}">{esc(p.stem)}</a>' for p in model_figures[1:]) + "</p>")
        model_results = [res for _, _, res in members]
        parts.append("<h3>Protocol</h3>" + protocol_card(group, model_results))
        ar = next((i for i, res in enumerate(model_results) if res["run"]["method"] == AR_METHOD), None)
        metric = per_image_metric(model_results)
        keys = choose_prompts(model_results, ar, metric[0] if metric else None, n_prompts)
        if keys:
            how = (f"the first {(n_prompts + 1) // 2} and those where the runs' {metric[1]} differs most from "
                   f"{'AR' if ar is not None else 'run to run'}" if metric else "the first ones")
            parts.append(f"<h3>Images, prompt by prompt</h3><p>{len(keys)} images ({how}); every run's image of the "
                         "same prompt, sample and seed, AR first (grey); caption: NFE, step compression, "
                         f"{metric[1] if metric else 'no per-image metric'}.</p>" + legend()
                         + comparison(members, keys, metric, out))
        parts.append("<h3>Runs</h3>" + "".join(run_section(res, label, anchor, table_id)
                                               for label, anchor, res in members))
        sections.append(f'<section class="model">{"".join(parts)}</section>')
    main = main_quality(df)
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>csd-bench report</title><style>{CSS}</style></head><body>"
        f"<h1>csd-bench report</h1><p>{len(df)} runs; main quality: {esc(COLUMNS.get(main, main) or 'none')}; "
        "tables, figures and CSVs of this report lie next to this page (report.md).</p>"
        f"<ul>{''.join(toc)}</ul>{''.join(sections)}<script>{JS}</script></body></html>\n"
    )
    path = out / HTML_FILE
    path.write_text(page, encoding="utf-8")
    log.info("report page: %s (%.0f kB)", path, path.stat().st_size / 1024)
    return path
