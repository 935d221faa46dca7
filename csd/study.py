"""The matched-compression study (``stage=study``; docs/EVALUATION.md#matched-compression-study).

One command runs it: AR and SJD runs, then per relaxed rule a knob calibration to step compressions
``target x SJD's`` (:func:`csd.report.matched.match_compression` on the first ``study.calibration_prompts``
prompts), a full run (generate + evaluate) at every reachable target, and the analysis: quality with its 95 %
intervals at matched compression, where relaxed acceptances land (region, target entropy), AR's target entropy
per region, and what a relaxed acceptance costs per region against SJD on the same prompt and seed
(:mod:`csd.evaluation.attribution`). Everything is resumable: finished runs are not redone and calibrations are
cached in ``<root>/study_calibration.json``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from csd.compose import Models, build_drafter, build_rule, load_prompts
from csd.decode import RunImages
from csd.deprecations import move_deprecated_keys, rule_class_of
from csd.device import resolve_device
from csd.errors import ConfigError
from csd.evaluation import METRICS_FILE
from csd.evaluation.attribution import (
    REGIONS,
    PairOutcome,
    divergence,
    failure_cost,
    marginal_cost,
    region_labels,
)
from csd.evaluation.content import acceptance_by_entropy, on_grid, region_grid
from csd.evaluation.intervals import paired
from csd.params import current_names
from csd.presets import method_config
from csd.records import load_records, record_files
from csd.report.collect import load_run
from csd.report.matched import KnobMatch, bracketing_mixture, match_compression
from csd.schema import Float
from csd.validate import validate

log = logging.getLogger(__name__)
CALIBRATION_FILE = "study_calibration.json"
#: metrics compared at matched compression (scene accuracies are added per ``eval.toy.categories``)
QUALITY = ("clip_score", "fid")


def run_config(cfg: DictConfig, setup: DictConfig, run_dir: Path) -> DictConfig:
    """The study config as one run's: method and drafter replaced by ``setup``'s, ``run_dir`` set, both stages."""
    out = cfg.copy()
    with open_dict(out):
        out.method, out.drafter = setup.method, setup.drafter
        out.run_dir = str(run_dir)
        out.stage = "all"
    return out


def rule_method(spec: DictConfig, knob: float) -> DictConfig:
    """The method and drafter of a study rule (``spec.method`` with ``spec.overrides``) at knob value ``knob``."""
    return method_config(spec.method, {**OmegaConf.to_container(spec.overrides), spec.knob: knob})


def check_study(cfg: DictConfig) -> None:
    """Cross-key checks of ``study`` (one :class:`ConfigError` line each), before any model loads: rules given,
    each knob a real-valued hyper-parameter of its rule, ``lo < hi`` (``lo > 0`` on a log scale), and the rule's
    config valid at both ends of its bracket (the schema and the rule's own checks)."""
    study = cfg.study
    if not study.rules:
        raise ConfigError("study.rules is empty: give at least one label -> {method, knob, lo, hi, increasing, log_scale, "
                          "overrides}")
    for name, spec in study.rules.items():
        where = f"study.rules.{name}"
        method = method_config(spec.method, {}).method
        declared = get_class(method._target_).PARAMS
        if spec.knob not in declared or not isinstance(declared[spec.knob].spec, Float):
            raise ConfigError(f"{where}.knob={spec.knob!r} must be a real-valued hyper-parameter of method={spec.method} "
                              f"(it has {sorted(declared)})")
        for extra in spec.overrides:
            if extra not in declared:
                raise ConfigError(f"{where}: {extra!r} is not a parameter of method={spec.method} (it has "
                                  f"{sorted(declared)})")
        if not spec.lo < spec.hi:
            raise ConfigError(f"{where}: need lo < hi, got lo={spec.lo}, hi={spec.hi}")
        if spec.log_scale and spec.lo <= 0:
            raise ConfigError(f"{where}: log_scale=true needs lo > 0, got lo={spec.lo}")
        for end in (spec.lo, spec.hi):
            try:
                validate(run_config(cfg, rule_method(spec, end), Path(cfg.run_dir)))
            except ConfigError as err:
                raise ConfigError(f"{where} at {spec.knob}={end:g}: {err}") from None


def records_by_key(run_dir: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["prompt_id"], r["sample"]): r for r in load_records(run_dir)}


def ensure_run(cfg: DictConfig, models: Models) -> dict[str, Any]:
    """Generate (resumes; a finished run generates nothing) with the study's model (``models``) and evaluate unless
    ``metrics.json`` is newer than every records file; returns the run's metrics.json."""
    from csd.evaluate import evaluate_run
    from csd.pipeline import generate_run

    run_dir = generate_run(cfg, models)
    metrics = run_dir / METRICS_FILE
    newest = max(p.stat().st_mtime for p in record_files(run_dir))
    if metrics.exists() and metrics.stat().st_mtime > newest:
        return json.loads(metrics.read_text())
    return evaluate_run(run_dir, cfg)


class Calibrator:
    """Step compression of a method on the first ``n`` prompts (all samples, the runs' own seeds), decoded by one
    engine per knob value on the study's adapter and compiled step (``models``, shared with its runs); a knob value is
    measured once."""

    def __init__(self, cfg: DictConfig, n: int, models: Models) -> None:
        from csd.pipeline import image_seed

        prompts = load_prompts(cfg.dataset)[:n]
        self.cfg = cfg
        self.requests = [(p.text, image_seed(cfg.seed, i, s)) for i, p in enumerate(prompts)
                         for s in range(cfg.dataset.samples_per_prompt)]
        self.keys = [(p.prompt_id, s) for p in prompts for s in range(cfg.dataset.samples_per_prompt)]
        self.models = models

    def compression(self, setup: DictConfig) -> float:
        """Mean per-image step compression (tokens / NFE), the definition of ``metrics.json``'s ``step_compression``."""
        from csd.engine import JacobiEngine
        from csd.slot import Request

        adapter = self.models.adapter(self.cfg.model, resolve_device(self.cfg.device))
        move_deprecated_keys(setup)
        engine = JacobiEngine(adapter, build_rule(setup.method), build_drafter(setup.drafter),
                              batch_size=self.cfg.engine.batch_size, compiled=self.models.compiled(adapter, self.cfg.engine))
        gens = [gen for _, gen in engine.generate_many(Request(text, seed) for text, seed in self.requests)]
        return float(np.mean([g.step_compression for g in gens]))


def calibration_key(key: str) -> str:
    """A cached calibration's key with its rule's knob and overrides under their current parameter names (a study
    calibrated before a rename keeps its cache)."""
    entry = json.loads(key)
    cls = rule_class_of(entry["method"])
    if cls is None or not cls.renamed:
        return key
    entry["knob"] = cls.renamed.get(entry["knob"], entry["knob"])
    entry["overrides"] = current_names(cls, entry["overrides"])
    return json.dumps(entry, sort_keys=True)


def calibrate(cfg: DictConfig, name: str, reference: float, calibrator: Calibrator, root: Path) -> list[KnobMatch]:
    """One :class:`KnobMatch` per ``study.targets`` gain (target = gain x ``reference``, SJD's compression on the
    calibration prompts), cached in ``<root>/study_calibration.json`` under everything that determines it."""
    spec, study = cfg.study.rules[name], cfg.study
    key = json.dumps({"rule": name, **OmegaConf.to_container(spec), "targets": list(study.targets),
                      "prompts": calibrator.keys, "reference": reference, "tol": study.tol, "max_evals": study.max_evals,
                      "model": OmegaConf.to_container(cfg.model), "seed": cfg.seed}, sort_keys=True)
    path = root / CALIBRATION_FILE
    cache = {calibration_key(k): v for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
    if key in cache:
        return [KnobMatch(**m) for m in cache[key]]
    measured: dict[float, float] = {}

    def measure(knob: float) -> float:
        if knob not in measured:
            measured[knob] = calibrator.compression(rule_method(spec, knob))
            log.info("calibration %s %s=%.4g: compression %.3f (SJD %.3f)", name, spec.knob, knob, measured[knob], reference)
        return measured[knob]

    matches = [match_compression(measure, gain * reference, spec.lo, spec.hi, increasing=spec.increasing,
                                 log_scale=spec.log_scale, tol=study.tol, max_evals=study.max_evals)
               for gain in study.targets]
    cache = {calibration_key(k): v for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
    cache[key] = [asdict(m) for m in matches]
    path.write_text(json.dumps(cache, indent=1))
    return matches


def unmatched(match: KnobMatch, tol: float) -> str:
    """Why a target got no run: outside what the bracket's ends reach, or not hit within ``tol`` (measured
    compression is noisy, and not monotone on few prompts) in the evaluations allowed."""
    ends = [c for _, c in match.evaluations[:2]]
    if not min(ends) < match.target < max(ends):
        return "unreachable"
    return f"not matched within tol={tol:g} after {len(match.evaluations)} evaluations"


def run_name(name: str, gain: float) -> str:
    return f"{name}_x{gain:.2f}"


def run_study(cfg: DictConfig) -> Path:
    """Run the study into ``cfg.sweep_dir`` or ``cfg.run_dir``; returns ``<root>/study``."""
    validate(cfg)
    check_study(cfg)
    root = Path(cfg.sweep_dir or cfg.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    models = Models()  # one adapter and compiled step for the calibration and every run
    for ref in ("ar", "sjd"):
        runs[ref] = {"metrics": ensure_run(run_config(cfg, method_config(ref, {}), root / ref), models), "dir": root / ref}
    calibrator = Calibrator(cfg, cfg.study.calibration_prompts, models)
    sjd_records = records_by_key(root / "sjd")
    reference = float(np.mean([sjd_records[k]["step_compression"] for k in calibrator.keys]))
    rules: dict[str, list[dict[str, Any]]] = {}
    for name, spec in cfg.study.rules.items():
        rules[name] = []
        for gain, match in zip(cfg.study.targets, calibrate(cfg, name, reference, calibrator, root), strict=True):
            entry: dict[str, Any] = {"gain": gain, "method": spec.method, "knob": spec.knob,
                                     "calibration": asdict(match)}
            if match.reachable:
                run_dir = root / run_name(name, gain)
                metrics = ensure_run(run_config(cfg, rule_method(spec, match.knob), run_dir), models)
                runs[run_dir.name] = {"metrics": metrics, "dir": run_dir}
                entry["run"] = run_dir.name
            else:
                entry["unmatched"] = unmatched(match, cfg.study.tol)
                log.warning("%s: x%.2f SJD's compression (%.3f) %s in %s=[%g, %g]; closest %.3f at %s=%.4g", name, gain,
                            match.target, entry["unmatched"], spec.knob, spec.lo, spec.hi, match.compression, spec.knob,
                            match.knob)
            rules[name].append(entry)
    return write_analysis(cfg, root, runs, rules, reference)


# ----------------------------------------------------------------------------------------------------- analysis


def quality_row(metrics: dict[str, Any], categories: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{metric: {value, interval}}`` for step compression, scene accuracy per category, toy-CLIP and FID."""
    names = ["step_compression", *(f"scene_acc_{c}" for c in categories), *QUALITY]
    m, iv = metrics["metrics"], metrics.get("intervals", {})
    return {n: {"value": m.get(n, math.nan), "interval": iv.get(n)} for n in names}


def region_map(image: np.ndarray, record: dict[str, Any], scene_key: str | None) -> np.ndarray:
    """``[rows, cols]`` region names of an image: object cells from its segmentation, else its scene's background kind."""
    from csd.evaluation.toy import scene_of
    from csd.toy import checker

    obj = region_grid(np.asarray(checker.segment(image)), record["grid"])
    return region_labels(obj, checker.background_kind(scene_of(record, scene_key)))


class Images:
    """Per run directory and (prompt_id, sample): the image, its region map and its scene check (each made once)."""

    def __init__(self, scene_key: str | None) -> None:
        self.scene_key = scene_key
        self._cache: dict[tuple[Path, str, int], tuple[np.ndarray, dict[str, Any]]] = {}
        self._runs: dict[Path, RunImages] = {}

    def of(self, run_dir: Path, record: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        from csd.evaluation.toy import scene_of
        from csd.toy import checker

        key = (run_dir, record["prompt_id"], record["sample"])
        if key not in self._cache:
            # the PNG, or the record's tokens decoded with the run's model (csd.decode): committed runs have no PNGs
            image = self._runs.setdefault(run_dir, RunImages(run_dir, records=())).array(record)
            self._cache[key] = (region_map(image, record, self.scene_key),
                                checker.check_image(image, scene_of(record, self.scene_key)))
        return self._cache[key]


def attribution(run_dir: Path, sjd_dir: Path, images: Images, categories: Sequence[str], n_boot: int,
                ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, Any]]]:
    """A relaxed run against SJD on the same (prompt_id, sample), regions of SJD's image
    (csd.evaluation.attribution): :func:`failure_cost` (first differing token = causal origin) and
    :func:`marginal_cost` of the overall scene check (or the first category), intervals over prompts."""
    sjd = records_by_key(sjd_dir)
    pairs, clusters = [], []
    for rec in load_records(run_dir):
        ref = sjd[(rec["prompt_id"], rec["sample"])]
        regions, ref_check = images.of(sjd_dir, ref)
        _, check = images.of(run_dir, rec)
        div = divergence(on_grid(ref, "tokens"), on_grid(rec, "tokens"), regions)
        pairs.append(PairOutcome(on_grid(rec, "commit_kind"), regions, div, ref_check, check))
        clusters.append(rec["prompt_id"])
    category = "overall" if "overall" in categories else categories[0]
    return failure_cost(pairs, categories), marginal_cost(pairs, clusters, category, n_boot)


def at_targets(root: Path, entries: Sequence[dict[str, Any]], targets: Sequence[float], names: Sequence[str],
                n_boot: int) -> list[dict[str, Any]]:
    """Quality at exactly ``gain`` x SJD's step compression on the full prompt set: the mixture of the two measured
    operating points that bracket it (SJD is every rule's lossless end; :func:`bracketing_mixture`), each per-image
    mean metric ``w * run_a + (1 - w) * run_b`` with one prompt resample for both runs (paired bootstrap). FID is
    not a per-image mean, so it has no mixture value. A target beyond the rule's furthest run is ``outside``."""
    points = {"sjd": load_run(root / "sjd"), **{e["run"]: load_run(root / e["run"]) for e in entries if "run" in e}}
    labels, comps = list(points), [points[n]["metrics"]["step_compression"] for n in points]
    out = []
    for gain in targets:
        target = gain * comps[0]
        found = bracketing_mixture(target, comps)
        if found is None:
            out.append({"gain": gain, "target": target, "outside": [min(comps), max(comps)]})
            continue
        i, j, w = found
        a, b = points[labels[i]]["per_image"], points[labels[j]]["per_image"]
        quality = {}
        for name in names:
            cmp = paired(a, b, name, n_boot, lambda x, y, w=w: w * x + (1 - w) * y)
            quality[name] = {"value": cmp.value if cmp else math.nan, "interval": cmp.interval if cmp else None}
        out.append({"gain": gain, "target": target, "mixture": {labels[i]: w, labels[j]: 1 - w}, "quality": quality})
    return out


def entropy_edges(vocab: int, bins: int = 16) -> np.ndarray:
    """Target-entropy bin edges: ``[0, 1e-3)`` then ``bins - 1`` log-spaced bins up to ``log(vocab)`` nats (a
    confident model puts most positions far below 1 nat, where equal-width bins see one bin)."""
    return np.concatenate([[0.0], np.geomspace(1e-3, math.log(vocab), bins)])


def entropy_by_region(run_dir: Path, images: Images, edges: np.ndarray) -> dict[str, dict[str, Any]]:
    """Histogram (``edges``, counts), mean and quantiles of a run's target entropy per region of its own images."""
    values: dict[str, list[np.ndarray]] = {reg: [] for reg in REGIONS}
    for rec in load_records(run_dir):
        regions, _ = images.of(run_dir, rec)
        ent = on_grid(rec, "entropy").astype(float)
        for reg in REGIONS:
            values[reg].append(ent[regions == reg])
    out = {}
    for reg, parts in values.items():
        x = np.concatenate(parts) if parts else np.zeros(0)
        quantiles = dict(zip(("q10", "q50", "q90"), np.quantile(x, [0.1, 0.5, 0.9]).tolist(), strict=True)) if x.size else {}
        out[reg] = {"edges": edges.tolist(), "count": np.histogram(x, bins=edges)[0].tolist(), "n": int(x.size),
                    "mean": float(x.mean()) if x.size else math.nan, **quantiles}
    return out


def write_analysis(cfg: DictConfig, root: Path, runs: dict[str, dict[str, Any]], rules: dict[str, list[dict[str, Any]]],
                   reference: float) -> Path:
    """``<root>/study/``: study.json, study.md and the four figures (docs/EVALUATION.md#matched-compression-study)."""
    out = root / "study"
    out.mkdir(exist_ok=True)
    t = cfg.eval.toy
    categories = list(t.categories)
    scene_key = t.scene_key
    images = Images(scene_key)
    vocab = json.loads((root / "ar" / "run.json").read_text())["model_info"]["vocab_size"]
    edges = entropy_edges(vocab)
    for entries in rules.values():
        for entry in entries:
            if "run" not in entry:
                continue
            run = runs[entry["run"]]
            content = run["metrics"].get("content", {})
            entry["quality"] = quality_row(run["metrics"], categories)
            entry["relaxed_by_region"] = content.get("regions")
            entry["relaxed_by_entropy"] = acceptance_by_entropy(load_records(run["dir"]), edges)
            entry["cost_by_region"], entry["marginal_cost"] = attribution(run["dir"], root / "sjd", images, categories,
                                                                          cfg.eval.bootstrap)
    mixed = ["step_compression", *(f"scene_acc_{c}" for c in categories), "clip_score"]
    study = {
        "sjd_compression_calibration": reference,
        "targets": list(cfg.study.targets),
        "references": {ref: quality_row(runs[ref]["metrics"], categories) for ref in ("ar", "sjd")},
        "ar_entropy_by_region": entropy_by_region(root / "ar", images, edges),
        "rules": rules,
        "at_targets": {name: at_targets(root, entries, cfg.study.targets, mixed, cfg.eval.bootstrap)
                       for name, entries in rules.items()},
    }
    (out / "study.json").write_text(json.dumps(study, indent=1, default=float))
    (out / "study.md").write_text(markdown(study, categories))
    figures(study, out, categories)
    return out


def fmt(cell: dict[str, Any], digits: int = 3) -> str:
    v, iv = cell["value"], cell["interval"]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f} [{iv[0]:.{digits}f}, {iv[1]:.{digits}f}]" if iv else f"{v:.{digits}f}"


def markdown(study: dict[str, Any], categories: Sequence[str]) -> str:
    """study.md: one table of quality at matched compression, one of where relaxed acceptances land and cost."""
    names = ["step_compression", *(f"scene_acc_{c}" for c in categories), *QUALITY]
    lines = ["# Matched-compression study", "",
             f"SJD's step compression on the calibration prompts: {study['sjd_compression_calibration']:.3f}. "
             "Values are point estimates with 95 % intervals over prompts (docs/EVALUATION.md).", "",
             "| rule | target | knob | " + " | ".join(names) + " |", "|" + "---|" * (3 + len(names))]
    for ref, row in study["references"].items():
        lines.append(f"| {ref} | | | " + " | ".join(fmt(row[n]) for n in names) + " |")
    for rule, entries in study["rules"].items():
        for e in entries:
            knob = f"{e['knob']}={e['calibration']['knob']:.4g}"
            if "run" in e:
                lines.append(f"| {rule} | x{e['gain']:.2f} | {knob} | " + " | ".join(fmt(e["quality"][n]) for n in names) + " |")
            else:
                lines.append(f"| {rule} | x{e['gain']:.2f} | {knob} | {e['unmatched']}: calibration reached "
                             f"{e['calibration']['compression']:.3f} for target {e['calibration']['target']:.3f} |"
                             + " |" * (len(names) - 1))
    mixed = [n for n in names if n != "fid"]
    lines += ["", "Quality at exactly the target step compression on the full prompt set (gain x SJD's "
              f"{study['references']['sjd']['step_compression']['value']:.3f}): the mixture of the two runs that bracket "
              "it (SJD is every rule's lossless end), weights in `mix`; paired 95 % intervals. FID is not a per-image "
              "mean and has no mixture value.", "",
              "| rule | target | mix | " + " | ".join(mixed) + " |", "|" + "---|" * (3 + len(mixed))]
    for rule, cells in study["at_targets"].items():
        for c in cells:
            if "outside" in c:
                lo, hi = c["outside"]
                why = f"beyond the rule's runs ({lo:.3f}-{hi:.3f})" if hi > lo else "no run of the rule (above)"
                lines.append(f"| {rule} | x{c['gain']:.2f} = {c['target']:.3f} | {why} |" + " |" * len(mixed))
                continue
            mix = " + ".join(f"{w:.2f} {run}" for run, w in c["mixture"].items() if w > 0)
            lines.append(f"| {rule} | x{c['gain']:.2f} = {c['target']:.3f} | {mix} | "
                         + " | ".join(fmt(c["quality"][n]) for n in mixed) + " |")
    head = ["rule", "target", *(f"relaxed rate {r}" for r in REGIONS), *(f"first-difference cost {r}" for r in REGIONS),
            "fails (SJD passes)", *(f"marginal cost {r}" for r in REGIONS)]
    lines += ["", "Relaxed acceptances per region (share of the region's positions) and their cost against SJD (same "
              "prompt and seed; docs/EVALUATION.md). First-difference cost: scene failures (overall) charged to the "
              "region of the first token that differs from SJD, per relaxed acceptance there (biased against regions "
              "decoded early). Marginal cost: added failure probability per relaxed acceptance in the region (linear "
              "model over the images SJD gets right, 95 % interval; saturates when most fail).", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rule, entries in study["rules"].items():
        for e in (e for e in entries if "run" in e):
            regions = e["relaxed_by_region"] or {}
            rates = [f"{regions.get(r, {}).get('relaxed_rate', math.nan):.4f}" for r in REGIONS]
            costs = [f"{e['cost_by_region'][r].get('cost_overall', math.nan):.4f}" for r in REGIONS]
            marginal = e["marginal_cost"]
            fails = f"{marginal[REGIONS[0]]['failure_rate']:.3f} of {marginal[REGIONS[0]]['pairs']}"
            slopes = [fmt(marginal[r]) for r in REGIONS]
            lines.append(f"| {rule} | x{e['gain']:.2f} | " + " | ".join([*rates, *costs, fails, *slopes]) + " |")
    return "\n".join(lines) + "\n"


def _err(cell: dict[str, Any]) -> tuple[float, float]:
    """Error-bar lengths of a cell's interval (a percentile interval need not contain the point: clipped at 0)."""
    v, iv = cell["value"], cell["interval"]
    return (max(v - iv[0], 0.0), max(iv[1] - v, 0.0)) if iv else (0.0, 0.0)


def figures(study: dict[str, Any], out: Path, categories: Sequence[str]) -> None:
    """quality_vs_compression.png, relaxed_by_region.png, relaxed_by_entropy.png (when a rule has a run),
    entropy_by_region_ar.png, cost_by_region.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("scene_acc_overall" if "overall" in categories else f"scene_acc_{categories[0]}", "scene accuracy"),
              ("clip_score", "toy-CLIP score"), ("fid", "toy FID")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for ref, marker in (("ar", "s"), ("sjd", "D")):
            x, y = study["references"][ref]["step_compression"], study["references"][ref][metric]
            xe, ye = _err(x), _err(y)
            ax.errorbar([x["value"]], [y["value"]], xerr=[[xe[0]], [xe[1]]], yerr=[[ye[0]], [ye[1]]], capsize=3,
                        fmt=marker, color="black" if ref == "sjd" else "grey", label=ref)
        for rule, entries in study["rules"].items():
            rows = [e["quality"] for e in entries if "run" in e]
            if not rows:
                continue
            # SJD is every rule's lossless end; a segment between two points is attainable by mixing the two runs
            rows = sorted([study["references"]["sjd"], *rows], key=lambda q: q["step_compression"]["value"])
            xs = [r["step_compression"]["value"] for r in rows]
            ys = [r[metric]["value"] for r in rows]
            xerr = np.array([_err(r["step_compression"]) for r in rows]).T
            yerr = np.array([_err(r[metric]) for r in rows]).T
            ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="-o", capsize=3, label=rule)
        ax.set_xlabel("step compression (tokens / NFE)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "quality_vs_compression.png", dpi=120)
    plt.close(fig)

    done = [(f"{rule} x{e['gain']:.2f}", e) for rule, entries in study["rules"].items() for e in entries if "run" in e]
    width = 0.8 / len(REGIONS)
    x = np.arange(len(done))
    size = (max(5, 1.2 * len(done) + 2), 4)

    def bars(ax: Any, cells: Callable[[dict[str, Any], str], dict[str, Any]], ylabel: str) -> None:
        for j, reg in enumerate(REGIONS):
            got = [cells(e, reg) for _, e in done]
            values = [np.nan if c["value"] is None else c["value"] for c in got]
            err = np.array([_err(c) if c["value"] is not None else (0.0, 0.0) for c in got]).T.reshape(2, len(got))
            ax.bar(x + j * width, values, width, yerr=err if err.any() else None, capsize=2, label=reg)
        ax.set_xticks(x + width, [label for label, _ in done], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.legend()

    fig, ax = plt.subplots(figsize=size)
    bars(ax, lambda e, r: {"value": (e["relaxed_by_region"] or {}).get(r, {}).get("relaxed_rate", math.nan),
                           "interval": None}, "relaxed acceptances / positions")
    fig.tight_layout()
    fig.savefig(out / "relaxed_by_region.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(size[0], 8), sharex=True)
    bars(axes[0], lambda e, r: {"value": e["cost_by_region"][r].get("cost_overall", math.nan), "interval": None},
         "first-difference cost\n(failures charged / relaxed acc.)")
    bars(axes[1], lambda e, r: e["marginal_cost"][r], "marginal cost\n(added P(fail) / relaxed acc.)")
    axes[1].axhline(0, color="black", lw=0.5)
    fig.tight_layout()
    fig.savefig(out / "cost_by_region.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for reg, hist in study["ar_entropy_by_region"].items():
        if hist["n"]:
            ax.stairs(np.asarray(hist["count"]) / hist["n"], hist["edges"],
                      label=f"{reg} (n={hist['n']}, mean {hist['mean']:.3f})")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("target entropy H(q) (nats; first bin [0, 0.001))")
    ax.set_ylabel("share of the region's positions")
    ax.set_title("AR: target entropy per region")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "entropy_by_region_ar.png", dpi=120)
    plt.close(fig)

    gains = sorted({e["gain"] for _, e in done})
    if not gains:  # no rule reached a target: no relaxed acceptances to bin by entropy
        return
    fig, axes = plt.subplots(1, len(gains), figsize=(5 * len(gains), 4), sharey=True, squeeze=False)
    for ax, gain in zip(axes[0], gains, strict=True):
        for label, e in done:
            if e["gain"] == gain:
                hist = e["relaxed_by_entropy"]
                ax.stairs(hist["relaxed"], hist["edges"], label=label.rsplit(" ", 1)[0])
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlabel("target entropy H(q) (nats)")
        ax.set_title(f"x{gain:.2f} SJD's compression")
    axes[0][0].set_ylabel("relaxed acceptances / positions")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "relaxed_by_entropy.png", dpi=120)
    plt.close(fig)

