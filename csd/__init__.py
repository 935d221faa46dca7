"""csd-bench: speculative Jacobi decoding of AR text-to-image models with pluggable acceptance rules."""

from csd.api import Decoder, compose_config

__all__ = ["Decoder", "compose_config"]
