"""The notebook API uses the same configs and engine as run.py."""

from __future__ import annotations

import pytest

from csd import Decoder
from csd.config import ConfigError


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
