"""A small Python API for notebooks: the same configs, validation and engine as ``run.py``, without Hydra's CLI.

    from csd import Decoder
    dec = Decoder(model="toy", method="csd", **{"method.lam": 0.2})   # run.py's defaults: Decoder()
    image, gen = dec.generate("a red circle above a blue square", seed=0)
    sjd = dec.with_method("sjd")          # same loaded model, another acceptance rule
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from csd.adapters.base import ModelAdapter
from csd.compose import build_adapter, build_drafter, build_rule
from csd.device import resolve_device
from csd.engine import Generation, JacobiEngine
from csd.errors import ConfigError
from csd.presets import CONF_DIR
from csd.validate import validate


def compose_config(model: str | None, method: str | None, overrides: dict[str, Any] | None = None) -> DictConfig:
    """The run config ``python run.py model=<model> method=<method> key=value ...`` would use (None: run.py's default,
    ``conf/config.yaml``)."""
    chosen = {"model": model, "method": method}
    args = [f"{k}={v}" for k, v in chosen.items() if v is not None] + [f"{k}={v}" for k, v in (overrides or {}).items()]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=args)
    with open_dict(cfg):
        cfg.run_dir = None
    validate(cfg)
    return cfg


class Decoder:
    """One target model and one decoding method (None: run.py's default, the toy and CSD); ``generate`` returns the
    image and the engine's record."""

    def __init__(self, model: str | None = None, method: str | None = None, adapter: ModelAdapter | None = None,
                 **overrides: Any) -> None:
        self.cfg = compose_config(model, method, overrides)
        self.overrides = overrides
        self.adapter = adapter or build_adapter(self.cfg.model, resolve_device(self.cfg.device))
        self.engine = JacobiEngine(self.adapter, build_rule(self.cfg.method), build_drafter(self.cfg.drafter))

    def generate(self, prompt: str, seed: int = 0) -> tuple[np.ndarray, Generation]:
        """One image of ``prompt``; a prompt the model cannot read (empty, or outside the toy's vocabulary:
        :meth:`csd.adapters.base.ModelAdapter.caption_problem`) is a :class:`ConfigError` before decoding."""
        problem = "is empty" if not prompt.strip() else type(self.adapter).caption_problem(prompt)
        if problem is not None:
            reads = type(self.adapter).reads
            raise ConfigError(f"prompt {prompt!r} {problem}" + (f": model={self.cfg.model.name} reads {reads}"
                                                                 if reads and prompt.strip() else ""))
        gen = self.engine.generate(prompt, seed)
        return self.adapter.decode_images(gen.tokens.unsqueeze(0))[0].numpy(), gen

    def with_method(self, method: str, **overrides: Any) -> Decoder:
        """Another method on the already-loaded model (model overrides of this decoder are kept)."""
        model_overrides = {k: v for k, v in self.overrides.items() if not k.startswith(("method.", "drafter"))}
        return Decoder(self.cfg.model.name, method, adapter=self.adapter, **model_overrides, **overrides)
