"""Hyper-parameters declared once, by the class that uses them: allowed values, default and help.

An acceptance rule or a drafter lists its parameters in ``PARAMS`` (name -> :class:`Param`); its constructor takes
exactly those, checks each against its spec (``csd.schema``: the same one-line messages as the config) and sets it
as an attribute. The config checks (``csd.validate.validate``), the "ignored key" warning and the docs' tables read the
same declarations, so a new rule or drafter is its module plus its YAML file.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from csd.schema import Float, Int, Spec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Param:
    """One hyper-parameter: its allowed values (``spec``; ``spec.null`` says what null means, None: not allowed), its
    default and one line of help."""

    spec: Spec
    default: Any
    help: str


class Parametrized:
    """A class configured by its declared ``PARAMS``; ``group`` (``method`` or ``drafter``) names its keys in messages.

    ``renamed`` maps names a parameter had before to its current one: old configs, records and run directories
    keep working (:func:`current_names`).
    """

    PARAMS: ClassVar[dict[str, Param]] = {}
    renamed: ClassVar[dict[str, str]] = {}
    group: ClassVar[str] = "method"

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(self.PARAMS))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no parameter(s) {unknown}; it has {sorted(self.PARAMS)}")
        for key, param in self.PARAMS.items():
            value = values.get(key, param.default)
            message = param.spec.error(f"{self.group}.{key}", value)
            if message:
                raise ValueError(message)
            if value is not None and isinstance(param.spec, Float):
                value = float(value)
            elif value is not None and isinstance(param.spec, Int):
                value = int(value)
            setattr(self, key, value)
        self.check_params()

    def check_params(self) -> None:
        """Checks across parameters (one ``ValueError`` line); none by default."""

    def param_values(self) -> dict[str, Any]:
        """Every declared parameter's value."""
        return {key: getattr(self, key) for key in self.PARAMS}

    def with_tensor_params(self, device: torch.device) -> Any:
        """A shallow copy whose real-valued parameters (``Float`` specs, set) are 0-d float32 tensors on ``device``.

        A compiled function reads a Python float as a constant of its trace (a graph per value: each ``lam`` of a
        sweep or of the study's calibration compiles the verification again); a tensor is an input of the graph, one
        graph for every value. float32 is the dtype of the tensors a rule computes with (the target ``q`` is float32),
        and the one a Python scalar operand is computed in against them, so the results are the same, bit for bit
        (tested for every rule). Integer and choice parameters stay Python values: they decide shapes and branches.
        """
        import torch  # not at import: the config checks read the declarations without torch

        twin = copy.copy(self)
        for key, param in self.PARAMS.items():
            value = getattr(self, key)
            if isinstance(param.spec, Float) and value is not None:
                setattr(twin, key, torch.tensor(value, dtype=torch.float32, device=device))
        return twin


def current_names(cls: type[Parametrized], params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the names ``cls`` renamed replaced by the current ones (a name given both ways keeps the
    current one's value)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = cls.renamed.get(key, key)
        if name not in out or key == name:
            out[name] = value
    return out
