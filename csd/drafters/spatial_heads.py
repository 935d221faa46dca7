"""Spatial draft heads (SSD, Spatially Speculative Decoding, arXiv 2606.20543; docs/ALGORITHMS.md "SSD"): from the
target's feature of one image cell and that cell's token, the law of the cells at fixed spatial offsets.

Offsets are in image cells, row-major over the image grid **without** structural columns (an end-of-line token is
not a cell): horizontal ``+1 .. +k_h`` (the next cells of the row), vertical ``+W, +2W .. +k_v W`` (the cells below,
``W`` the grid width in cells). For the cell ``s`` with token ``x_s`` and ``h_s`` the target's feature at the sequence
position whose logits gave the law of cell ``s``, head ``k`` predicts the feature whose logits give the law of cell
``s + offsets[k]``::

    z = [h_s ; e(x_s)]                                   (e: the target's frozen input embedding)
    h^_{s + o_k} = f_k(z),   f_k(z) = W0_k z + SwiGLU_k(RMSNorm_k(W0_k z))        (SSD's head)
    logits_k = head(h^_{s + o_k})                         (the target's frozen output head)

trained with SmoothL1 against the frozen target's features (``python -m experiments.train_drafter --kind spatial``).

**Pre- or post-norm.** The paper regresses the hidden state *before* the target's last RMSNorm and reads it out
through that norm and the head. Our adapters expose every model's feature *after* the final norm (``features_step``,
what ``head`` reads; the EAGLE head regresses the same), so the heads regress the post-norm feature and read it out
with ``adapter.head`` alone: the target's norm is then part of the regressed target instead of the readout, the same
function class, and one interface for every model. ``W0`` starts as ``[I 0]`` and the SwiGLU's output projection at
zero, so an untrained head predicts its own cell's feature (the neighbour's law, a sensible first draft).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from csd.errors import MissingWeightsError

if TYPE_CHECKING:
    from csd.adapters.base import ModelAdapter

TRAIN_HINT = ("train them with `python -m experiments.train_drafter --kind spatial model=<name> --out <file>` "
              "(docs/DRAFT_HEADS.md \"SSD spatial heads\")")


def spatial_offsets(width: int, k_h: int, k_v: int) -> tuple[int, ...]:
    """Horizontal offsets ``1 .. k_h``, then vertical ``W, 2W .. k_v W`` (cells, row-major, ``W = width``)."""
    return tuple(range(1, k_h + 1)) + tuple(d * width for d in range(1, k_v + 1))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last axis (computed in fp32)."""
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


class SpatialHeads(nn.Module):
    """``len(offsets)`` SSD heads over one target (module docstring), their weights stacked on a first head axis.

    ``hidden``: the target's feature width ``D``; ``width``: the image grid's width in cells ``W``; ``k_h`` / ``k_v``:
    horizontal / vertical heads; ``ffn``: the SwiGLU's inner width (default ``D``); ``embed`` / ``readout``: the
    target's input embedding (token ids ``[...]`` -> ``[..., D]``) and output head (``[..., D]`` -> logits
    ``[..., V]``), attached by :func:`load_spatial_heads` (frozen: they are not parameters of the heads)."""

    def __init__(self, hidden: int, width: int, k_h: int, k_v: int, ffn: int | None = None, eps: float = 1e-6,
                 embed: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 readout: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        if k_h < 0 or k_v < 0 or k_h + k_v == 0:
            raise ValueError(f"SpatialHeads needs at least one head, got k_h={k_h}, k_v={k_v}")
        self.hidden, self.width, self.k_h, self.k_v = hidden, width, k_h, k_v
        self.ffn, self.eps = ffn or hidden, eps
        self.offsets: tuple[int, ...] = spatial_offsets(width, k_h, k_v)
        k, d, f = len(self.offsets), hidden, self.ffn
        w0 = torch.zeros(k, d, 2 * d)
        w0[:, :, :d] = torch.eye(d)
        self.w0 = nn.Parameter(w0)                                   # [K, D, 2D]
        self.norm = nn.Parameter(torch.ones(k, d))                   # [K, D]
        self.gate = nn.Parameter(torch.randn(k, f, d) * d ** -0.5)   # [K, F, D]
        self.up = nn.Parameter(torch.randn(k, f, d) * d ** -0.5)     # [K, F, D]
        self.down = nn.Parameter(torch.zeros(k, d, f))               # [K, D, F]
        # the target's modules, frozen: kept out of the heads' parameters and state dict
        self._frozen: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {"embed": embed, "readout": readout}

    @property
    def embed(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The target's input embedding: token ids ``[...]`` -> ``[..., D]``."""
        return self._frozen["embed"]

    @property
    def readout(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The target's output head: features ``[..., D]`` -> logits ``[..., V]``."""
        return self._frozen["readout"]

    def config(self) -> dict[str, Any]:
        """The sizes :func:`save_spatial_heads` stores (the constructor's arguments)."""
        return {"hidden": self.hidden, "width": self.width, "k_h": self.k_h, "k_v": self.k_v, "ffn": self.ffn,
                "eps": self.eps}

    def attach(self, adapter: ModelAdapter) -> SpatialHeads:
        """Read tokens and laws through ``adapter``'s frozen embedding and output head; returns ``self``."""
        self._frozen.update(embed=adapter.embed, readout=adapter.head)
        return self

    def predict(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """``feature [..., D]``, ``token [...]`` (the target's token ids) -> predicted features ``[..., K, D]``."""
        if self.embed is None:
            raise RuntimeError("SpatialHeads has no embedding attached: load with load_spatial_heads(path, adapter) "
                               "or call heads.attach(adapter)")
        return self.predict_embedded(feature, self.embed(token))

    def predict_embedded(self, feature: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """:meth:`predict` from the token's embedding ``[..., D]`` (training reads it once per sequence)."""
        z = torch.cat([feature, embedded.to(feature.dtype)], dim=-1).to(self.w0.dtype)
        y = torch.einsum("kdi,...i->...kd", self.w0, z)                          # W0 z
        n = rms_norm(y, self.norm, self.eps)
        g = torch.einsum("kfd,...kd->...kf", self.gate, n)
        u = torch.einsum("kfd,...kd->...kf", self.up, n)
        return y + torch.einsum("kdf,...kf->...kd", self.down, nn.functional.silu(g) * u)  # + SwiGLU(RMSNorm(W0 z))

    def forward(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """``feature [..., D]``, ``token [...]`` -> raw logits ``[..., K, V]`` over the model's vocabulary (head ``k``:
        the law of cell ``s + offsets[k]``)."""
        if self.readout is None:
            raise RuntimeError("SpatialHeads has no output head attached: load with load_spatial_heads(path, adapter) "
                               "or call heads.attach(adapter)")
        return self.readout(self.predict(feature, token))


def save_spatial_heads(heads: SpatialHeads, path: str | Path, meta: dict[str, Any] | None = None) -> None:
    """Write ``heads`` (their config, fp32 weights and ``meta``: what they were trained on) to ``path``."""
    state = {k: v.detach().float().cpu() for k, v in heads.state_dict().items()}
    torch.save({"kind": "ssd_spatial_heads", "config": heads.config(), "state": state, "meta": meta or {}}, path)


def load_spatial_heads(path: str | Path, adapter: ModelAdapter | None = None) -> SpatialHeads:
    """The heads stored at ``path`` by :func:`save_spatial_heads`; with ``adapter``: checked against its width and
    grid, attached to its embedding and output head, on its device and dtype. A missing file is a
    :class:`csd.errors.MissingWeightsError` naming the command that trains one."""
    if not Path(path).is_file():
        raise MissingWeightsError(f"spatial heads {path}: no such file; {TRAIN_HINT}")
    stored = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(stored, dict) or stored.get("kind") != "ssd_spatial_heads":
        raise ValueError(f"{path} is not a spatial heads file (save_spatial_heads); {TRAIN_HINT}")
    heads = SpatialHeads(**stored["config"])
    heads.load_state_dict(stored["state"])
    heads.meta = stored.get("meta", {})
    if adapter is None:
        return heads.eval()
    decoder = adapter.decoder()
    width, grid_w = decoder.config.hidden_size, adapter.layout.grid[1]
    if heads.hidden != width or heads.width != grid_w:
        raise ValueError(f"spatial heads {path} were trained for hidden size {heads.hidden} and grid width "
                         f"{heads.width}, but the target's are {width} and {grid_w}; {TRAIN_HINT}")
    return heads.to(device=decoder.device, dtype=decoder.dtype).attach(adapter).eval()
