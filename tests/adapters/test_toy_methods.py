"""A short generation with every method on the shipped toy model, through the same API as run.py."""

from __future__ import annotations

import pytest

from csd import Decoder
from csd.presets import choices
from csd.toy.domain import toy_prompts


@pytest.fixture(scope="module")
def toy_ar():
    return Decoder(model="toy", method="ar", device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in choices("method") if m != "ar"])
def test_every_method_generates_on_the_toy(toy_ar, method):
    dec = toy_ar.with_method(method, **({"method.k": 16} if method == "lantern" else {}))
    image, gen = dec.generate(toy_prompts(1)[0].text, seed=0)
    assert image.shape == (32, 32, 3)
    assert gen.tokens.shape == (256,) and int(gen.tokens.max()) < 256
    assert gen.nfe < 256  # speculative decoding commits more than one token per forward on the toy
