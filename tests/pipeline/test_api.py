"""The notebook API uses the same configs and engine as run.py."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from csd import Decoder
from csd.errors import ConfigError
from csd.presets import CONF_DIR


def test_decoder_generates_and_switches_methods():
    dec = Decoder(model="janus_pro_tiny", method="csd", **{"method.lam": 0.0, "model.grid": 4})
    image, gen = dec.generate("a red apple", seed=3)
    assert image.shape == (8, 8, 3) and image.dtype.name == "uint8"
    sjd = dec.with_method("sjd")
    assert sjd.adapter is dec.adapter and sjd.cfg.model.grid == 4
    assert sjd.generate("a red apple", seed=3)[1].tokens.tolist() == gen.tokens.tolist()  # lam = 0 is SJD


def test_decoder_validates_before_loading():
    with pytest.raises(ConfigError, match="lam"):
        Decoder(model="janus_pro_7b", method="csd", **{"method.lam": -1})


@pytest.fixture(scope="module")
def toy_decoder() -> tuple[Decoder, str]:
    """``Decoder()`` (run.py's default model), and what its construction wrote to stderr."""
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        dec = Decoder()
    return dec, err.getvalue()


def test_decoder_defaults_to_run_py_model_without_a_loading_bar(toy_decoder):
    dec, stderr = toy_decoder
    defaults = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    assert dec.cfg.model.name == next(entry["model"] for entry in defaults if "model" in entry) == "toy"
    assert "Loading weights" not in stderr and "%|" not in stderr  # transformers' bar, silenced as in run.py


def test_toy_refuses_words_outside_its_vocabulary_before_decoding(toy_decoder, monkeypatch):
    dec, _ = toy_decoder
    monkeypatch.setattr(dec.engine, "generate", lambda *a, **k: pytest.fail("decoding started"))
    with pytest.raises(ConfigError, match=r"prompt 'a red apple on a table' has 2 unknown words \('apple', 'table'\): "
                                          r"model=toy reads only the 26 words .*use dataset=toy"):
        dec.generate("a red apple on a table")
    with pytest.raises(ConfigError, match="prompt '  ' is empty"):
        dec.generate("  ")
