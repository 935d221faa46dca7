"""Every config key and its allowed values (:data:`SCHEMA`), and what a run's keys name: the stages, the metrics of
a model (:func:`eval_metrics`), the keys a command line may set (:func:`known_keys`).

Every key of ``conf/`` has an entry in :data:`SCHEMA` (a test enforces it), or is declared by its rule's or drafter's
class (``csd.params``); ``csd.validate`` checks each value of a composed config against them. Importing this module
imports no model library and none of the plug-ins: the metric and image-step names come from ``csd.registry``, the
options of a group from its files (``csd.presets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from csd.errors import ConfigError
from csd.presets import CONF_DIR, choices
from csd.registry import fid_backend_names, metric_names, step_error
from csd.schema import (
    Bool,
    ByTarget,
    Choice,
    Device,
    Fields,
    Float,
    FloatList,
    Group,
    Int,
    IntList,
    IntOrWord,
    MapOf,
    Scalars,
    Spec,
    Str,
    StrList,
    StrMap,
    show,
)

STAGES = ("generate", "evaluate", "report", "status", "study", "plan", "decode", "all")
#: the drafting vocabulary (``drafter.init``, ``drafter.coupling``, ``drafter.draft_record``; ``csd.drafters.base``):
#: how a window's drafts start, how a draft is coupled to its verification, and the recorded ``p`` of a fresh random
#: draft (one-hot on itself, or the uniform law it was drawn from)
INIT_SCHEMES = ("random", "repeat_left")
COUPLINGS = ("none", "maximal", "gumbel")
#: ``drafter.skip`` (``drafter=eagle``, csd/drafters/skip.py): VVS's verification skipping, off or its two schedules
SKIP_POLICIES = ("none", "uniform", "similarity")
DRAFT_RECORDS = ("onehot", "uniform")
#: SSD (``drafter=ssd``, arXiv 2606.20543): horizontal heads ``k_h`` (cells +1 .. +k_h of the row), vertical heads
#: ``k_v`` (rows drafted at once below a complete row; 0: horizontal only) and correction rounds ``r`` before a block
#: is committed (0: committed unverified)
SSD_HORIZONTAL_HEADS = (1, 2, 3, 4, 5, 6, 7, 8)
SSD_VERTICAL_HEADS = (0, 1, 2)
SSD_ROUNDS = (0, 1, 2)
#: how ``drafter=hawk`` draws a cell's candidates from its spatial pool's laws (``csd.drafters.hawk``): sampled from
#: the law (recorded with it), or its most likely codes (recorded one-hot); both lossless
HAWK_DRAWS = ("sample", "top")


#: what null means for a key every method carries but only some use (method_keys.yaml)
UNSET = "for the method's default"


#: the keys every method file carries (conf/method_keys.yaml): null unless the chosen rule uses them
SHARED_METHOD_KEYS = tuple(OmegaConf.load(CONF_DIR / "method_keys.yaml"))


#: what null means for the deprecated drafting keys of method_keys.yaml
MOVED = "for the drafter's value (deprecated key: use drafter.<key>)"


#: ``engine.compile_backend``: torch.compile backends of the compiled step (``aot_eager``/``eager`` trace only)
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


#: ``dataset.caption_rule`` of COCO captions (the keys of ``csd.data.coco.CAPTION_RULES``, which imports this module)
CAPTION_RULES = ("longest", "sjd", "lantern")


#: every key of ``conf/``: ``group.key`` (nested: ``eval.fid.paired``) -> its allowed values
SCHEMA: dict[str, Spec | ByTarget] = {
    # conf/config.yaml
    "stage": Choice(options=STAGES),
    "seed": Int(min=0),
    "device": Device(),
    "threads": Int(min=1, null="for torch's default"),
    "run_dir": Str(null="for a new run directory", blank=False),
    "sweep_dir": Str(null="", blank=False),
    "status.stale_min": Float(gt=0),
    "published": MapOf(value=MapOf(value=MapOf(value=Fields(fields={
        "step_compression": Float(gt=0, null="when not published"), "speedup": Float(gt=0, null="when not published"),
        "fid": Float(min=0, null="when not published")}), what="method"), what="dataset"), what="model"),
    # stage=study (csd/study.py, docs/EVALUATION.md#matched-compression-study)
    "study.rules": MapOf(
        value=Fields(fields={"method": Group(group="method", options=choices), "knob": Str(), "lo": Float(min=0),
                             "hi": Float(min=0), "increasing": Bool(), "log_scale": Bool(), "overrides": Scalars()}),
        what="rule label",
    ),
    "study.targets": FloatList(gt=1),
    "study.calibration_prompts": Int(min=1),
    "study.tol": Float(gt=0),
    "study.max_evals": Int(min=2),
    # conf/method_keys.yaml, conf/method/*.yaml
    "method.name": Group(group="method", options=choices),
    "method._target_": Str(),
    # deprecated (the drafter group's keys, MOVED_TO_DRAFTER): null = unset
    "method.window": Int(min=1, null=MOVED),
    "method.init": Choice(options=INIT_SCHEMES, null=MOVED),
    "method.coupling": Choice(options=COUPLINGS, null=MOVED),
    "method.draft_record": Choice(options=DRAFT_RECORDS, null=MOVED),
    "method.tree_width": Int(min=1, null=MOVED),
    "method.tree_depth": Int(min=1, null=MOVED),
    "method.pac_code_parity": Bool(null=MOVED),
    # the rule's own keys: its class's declarations (csd.params, declared_spec)
    # conf/drafter/*.yaml
    "drafter.name": Group(group="drafter", options=choices),
    "drafter._target_": Str(),
    # the drafter's own keys: its class's declarations (csd.params, declared_spec)
    # conf/model/*.yaml
    "model.name": Group(group="model", options=choices),
    "model._target_": Str(),
    "model.path": Str(),
    "model.dtype": Choice(options=("float32", "bfloat16", "float16")),
    "model.guidance_scale": Float(gt=0),
    "model.top_k": Int(min=1, null="for no top-k"),
    "model.temperature": Float(gt=0),
    "model.entropy_temperature": Fields(
        fields={"t0": Float(min=0), "alpha": Float(gt=0), "theta": Float(min=0), "lo": Float(gt=0), "hi": Float(gt=0)},
        null="for off; the released Lumina-mGPT values: {t0: 1.5, alpha: 2.5, theta: 0.7, lo: 0.7, hi: 2.0}",
    ),
    "model.random_init": Bool(),
    "model.grid": ByTarget(IntList(length=2, min=1), {"csd.adapters.janus.tiny_janus_adapter": Int(min=1),
                                                      "csd.adapters.llamagen.tiny_llamagen_adapter": Int(min=1)}),
    "model.codebook": Int(min=1),
    "model.reference_render": Str(),
    "model.codes": Int(min=1),
    "model.seed": Int(min=0),
    "model.head_scale": Float(gt=0),
    "model.vqgan_config": Str(),
    "model.vqgan_ckpt": Str(),
    "model.resolution": Int(min=16),
    "model.jacobi_tail": Int(min=0),
    "model.layers": Int(min=1, null="for the checkpoint's depth"),
    "model.ratio": Str(),
    "model.image_area": Int(min=1),
    "model.positive_suffix": Str(),
    # LlamaGen (csd/adapters/llamagen.py)
    "model.kind": Choice(options=("c2i", "t2i")),
    "model.gpt_model": Choice(options=("GPT-B", "GPT-L", "GPT-XL")),
    "model.image_size": Int(min=16),
    "model.gpt_ckpt": Str(),
    "model.vq_ckpt": Str(),
    "model.t5": Str(),
    "model.negative_prompt": Str(),
    # conf/dataset/*.yaml
    "dataset.name": Group(group="dataset", options=choices),
    "dataset._target_": Str(),
    "dataset.annotations": Str(),
    "dataset.metadata": Str(),
    "dataset.n_prompts": Int(min=1, null="for all prompts"),
    "dataset.samples_per_prompt": Int(min=1),
    "dataset.fid_reference": Str(null="for none"),
    "dataset.split": Choice(options=("heldout", "train")),
    "dataset.num_shards": Int(min=1),
    "dataset.shard": Int(min=0),
    "dataset.caption_rule": Choice(options=CAPTION_RULES),
    "dataset.tsv": Str(blank=False),
    "dataset.csv_file": Str(blank=False),
    "dataset.sample_seed": Int(min=0),
    # conf/engine/*.yaml
    "engine.compile": Bool(),
    "engine.compile_backend": Choice(options=COMPILE_BACKENDS),
    "engine.max_cache_len": Int(min=1, null="for prompt + body + 64"),
    "engine.progress": Bool(),
    "engine.warmup": Int(min=0),
    "engine.batch_size": IntOrWord(min=1, word="auto"),
    "engine.memory_gb": Float(gt=0, null="for the free memory of the device (CPU: the available RAM)"),
    "engine.latency_probe": Int(min=0),
    # conf/eval/*.yaml
    "eval.metrics": StrList(names=metric_names, what="metric", null="for the model's own list"),
    "eval.strict": Bool(),
    "eval.allow_partial": Bool(),
    "eval.batch_size": Int(min=1),
    "eval.protocol": Str(),
    "eval.caption_rule": Choice(options=CAPTION_RULES, null="for any"),
    "eval.bootstrap": Int(min=0),
    "eval.clip.model": Str(),
    "eval.clip.pretrained": Str(),
    "eval.clip.model_config": Str(null=""),
    "eval.clip.transforms": StrList(check=step_error),
    "eval.clip.prefix": Str(),
    "eval.clip.scale": Float(gt=0),
    "eval.clip.clamp": Choice(options=("image", "mean", "none")),
    "eval.fid.reference_dir": Str(null="for dataset.fid_reference"),
    "eval.fid.reference_stats": Str(null="for reference images"),
    "eval.fid.paired": Bool(),
    "eval.fid.transforms": StrList(check=step_error),
    "eval.fid.package_transforms": StrList(check=step_error, null="for eval.fid.transforms"),
    "eval.fid.feature": Choice(options=(64, 192, 768, 2048)),
    "eval.fid.inception_weights": Str(null=""),
    "eval.fid.cache_dir": Str(),
    "eval.fid.backends": StrList(names=fid_backend_names, what="FID backend", nonempty=True, unique=True),
    "eval.fid.weights_dir": Str(null="for each package's own place (clean-fid: /tmp; pytorch-fid: the torch hub cache)"),
    "eval.content.entropy_bins": Int(min=1),
    "eval.toy.models": StrList(),
    "eval.toy.metrics": StrList(names=metric_names, what="metric", null=""),  # deprecated: eval.metrics
    "eval.toy.render": Str(),
    "eval.toy.scene_key": Str(null=""),
    "eval.toy.categories": StrList(),
    "eval.toy.only_if": StrMap(),
    "eval.report.out_dir": Str(null=""),
    "eval.report.extra_runs": StrList(),
    "eval.report.pareto_x": StrList(),
    "eval.report.pareto_y": StrList(),
    "eval.report.html_prompts": Int(min=0),
    "eval.geneval.detector": Str(),
    "eval.geneval.clip_model": Str(),
    "eval.geneval.clip_pretrained": Str(),
    "eval.geneval.threshold": Float(min=0, max=1),
    "eval.geneval.counting_threshold": Float(min=0, max=1),
    "eval.geneval.max_objects": Int(min=1),
    "eval.geneval.position_threshold": Float(min=0),
    "eval.hpsv2.weights": Str(null="until given (metric hpsv2 stops with the fetch command)", blank=False),
    "eval.image_reward.weights": Str(null="until given (metric image_reward stops with the fetch command)", blank=False),
    "eval.image_reward.tokenizer": Str(null="until given (metric image_reward stops with the fetch command)", blank=False),
    "eval.inception_score.splits": Int(min=1),
    "eval.inception_score.inception_weights": Str(null="for the torch hub cache", blank=False),
    "eval.precision_recall.k": Int(min=1),
    "eval.precision_recall.inception_weights": Str(null="for the torch hub cache", blank=False),
    "eval.precision_recall.features": Choice(options=("inception", "vgg16")),
    "eval.precision_recall.vgg16_weights": Str(null="for the torch hub cache", blank=False),
    "eval.dpg.vqa": Str(),
    "eval.dpg.model": Str(null="until given (metric dpg stops with the fetch command)", blank=False),
    # conf/logger/*.yaml
    "logger.name": Group(group="logger", options=choices),
    "logger.mode": Choice(options=("offline", "online", "disabled")),
    "logger.project": Str(),
    "logger.entity": Str(null=""),
    "logger.group": Str(null=""),
    "logger.tags": StrList(),
    "logger.dir": Str(null=""),
    "logger.max_images": Int(min=0),
}


#: ``eval.metrics=null``: the metrics of every model, and those of the toy models only (``eval.toy.models``: the
#: scene checker and the region analysis need the toy's scene specs and segmenter)
DEFAULT_METRICS = ("speed", "content", "clip_score", "fid")
TOY_METRICS = ("scene", "regions")


def eval_metrics(eval_cfg: DictConfig, model: str) -> list[str]:
    """The metrics the evaluate stage computes for a run of ``model``: ``eval.metrics``, for every model.

    ``eval.metrics=null`` (the default) is the model's own list: :data:`DEFAULT_METRICS`, plus :data:`TOY_METRICS`
    for a toy model. A toy-only metric asked of another model, or a metric the toy cannot compute asked of a toy model
    (``geneval`` scores GenEval prompts, which no toy model takes), is a :class:`ConfigError`. The deprecated
    ``eval.toy.metrics`` (which chose the toy's metrics while ``eval.metrics`` was ignored for it) still stands in
    for ``eval.metrics`` on toy models when ``eval.metrics`` is null; :func:`validate` warns about it.
    """
    toy = model in eval_cfg.toy.models
    names = eval_cfg.metrics
    old = OmegaConf.select(eval_cfg, "toy.metrics")
    if old is not None and names is not None:
        raise ConfigError(f"eval.toy.metrics={show(old)} and eval.metrics={show(names)}: eval.metrics now "
                          "chooses the metrics of every model (the toy's too); set only eval.metrics")
    if names is None and old is not None and toy:
        names = old
    if names is None:
        return [*DEFAULT_METRICS, *TOY_METRICS] if toy else list(DEFAULT_METRICS)
    if toy:
        unsupported = [n for n in names if n not in (*DEFAULT_METRICS, *TOY_METRICS)]
        if unsupported:
            raise ConfigError(f"eval.metrics={show(names)}: model={model} has no {unsupported[0]!r} metric (a toy model "
                              f"is scored with {[*DEFAULT_METRICS, *TOY_METRICS]}); drop it")
    unsupported = [n for n in names if n in TOY_METRICS and not toy]
    if unsupported:
        raise ConfigError(f"eval.metrics={show(names)}: model={model} has no {unsupported[0]!r} metric (the toy's "
                          f"only, eval.toy.models={show(eval_cfg.toy.models)}); drop it")
    return list(names)


def known_keys(dirs: Sequence[Path] = (CONF_DIR,)) -> list[str]:
    """:data:`SCHEMA`'s keys, the shared method keys and every key of a method or drafter file in ``dirs`` (its
    class's declared parameters)."""
    keys = set(SCHEMA) | {f"method.{k}" for k in SHARED_METHOD_KEYS}
    for conf in dirs:
        for group in ("method", "drafter"):
            for path in (conf / group).glob("*.yaml"):
                node = OmegaConf.load(path)
                node = node.get(group, {}) if path.read_text().startswith("# @package _global_") else node
                keys |= {f"{group}.{k}" for k in node if k != "defaults"}
    return sorted(keys)


def known_key(key: str, keys: Sequence[str]) -> bool:
    """Whether ``key`` is one of ``keys``, inside one that holds a mapping (``study.rules.<label>.knob``,
    ``model.entropy_temperature.t0``) or above some (``eval.fid``)."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in keys)
