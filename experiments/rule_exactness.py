"""Every rule class's compiled verification against its eager one, on a device (docs/PERFORMANCE.md "The compiled
verification").

``engine.compile=true`` verifies full windows with :func:`csd.drafters.chain.judge_windows` compiled, the rule's
real-valued parameters passed as tensors (``csd.params.Parametrized.with_tensor_params``), while the eager engine
calls the same function with the rule's Python floats. Both must commit the same tokens: a last-bit difference in a
likelihood ratio flips an acceptance now and then and changes the image without any error. :func:`judge_case` checks
one rule class on two 6-row windows of a tiny Janus's 16 codes whose drafts the target mostly rejects, for the rule's
preset values and for every real-valued parameter moved (the second must replay the first one's graph). The tests
run it on CPU (dynamo's trace, inductor's C++ code); the GPU check (``experiments.gpu_check``, part ``rules``) runs it
with inductor's Triton code on CUDA, where eager PyTorch computes a division by a Python scalar as a multiplication
by its reciprocal but divides by a tensor.

    python -m experiments.rule_exactness --backend inductor --device cuda

Prints one line per rule class and exits with status 1 when any differs.
"""

from __future__ import annotations

if __spec__ is None:  # run by path: refused in one line naming the `python -m` command (experiments/_entry.py)
    from _entry import refuse_path_run

    refuse_path_run(__file__)

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from torch._dynamo.utils import counters

from csd.acceptance import entropy
from csd.adapters.janus import tiny_janus_adapter
from csd.compose import build_rule
from csd.device import resolve_device
from csd.drafters.chain import judge_windows
from csd.fast import isolation
from csd.presets import CONF_DIR, method_config
from csd.schema import Float
from csd.verify import WindowNoise

#: the windows' shape: two windows of ``ROWS`` rows over the tiny Janus's ``CODES`` codes
WINDOWS, ROWS, CODES = 2, 6, 16
#: what each result of :func:`csd.drafters.chain.judge_windows` is
OUTPUTS = ("tokens", "kinds", "stats", "counts", "samples")


def rule_presets() -> list[str]:
    """The ``conf/method/`` presets that name a rule class (``_target_``), one per class: the others derive from them
    with other parameter values (``amplify_k4``, ``gsd_g25``, the drafter presets)."""
    first: dict[str, str] = {}
    for path in sorted((CONF_DIR / "method").glob("*.yaml")):
        config = yaml.safe_load(Path(path).read_text())
        target = config.get("_target_") or (config.get("method") or {}).get("_target_")
        if target is not None:
            first.setdefault(target, path.stem)
    return sorted(first.values())


def judge_case(method: str, backend: str, device: torch.device, fullgraph: bool = True) -> dict[str, Any]:
    """:func:`judge_windows` of ``method``'s rule (a ``conf/method/`` preset) compiled with ``backend`` (with
    ``fullgraph``, a graph break is an error; ``engine.compile`` compiles it without: ``CompiledStep.compile``), its
    real-valued parameters tensors on ``device`` as the compiled engine passes them, against the eager function with
    the rule's Python floats, on :data:`WINDOWS` windows of :data:`ROWS` rows of a tiny Janus's :data:`CODES` codes
    (inputs drawn on the CPU, seed 0, then moved); then the same for the rule with every real-valued parameter moved
    inside its allowed range, replaying the first graph (``fail_on_recompile``: a recompilation raises).

    Returns ``equal`` (every output bit for bit, both rules, from one compiled graph), ``unequal`` (``"<rule>:
    <output>"`` for each output that differs: ``preset`` or ``moved``; ``graphs: N`` when dynamo did not compile exactly
    one graph: 0 means the "compiled" function ran eagerly and compared nothing), ``graphs`` and ``rejected`` (a window
    was rejected, so the residual's sample was judged too)."""
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(3 * torch.randn((WINDOWS, ROWS, CODES), generator=gen), -1)
    draft_probs = torch.softmax(3 * torch.randn((WINDOWS, ROWS - 1, CODES), generator=gen), -1)
    drafts = torch.multinomial(draft_probs.view(-1, CODES), 1, generator=gen).view(WINDOWS, ROWS - 1)
    noise = WindowNoise.draw(WINDOWS, ROWS, CODES, gen, torch.device("cpu"))
    noise = WindowNoise(noise.samples.to(device), noise.uniforms.to(device), noise.residual.to(device))
    target, draft_probs, drafts = target.to(device), draft_probs.to(device), drafts.to(device)
    adapter = tiny_janus_adapter(grid=4, codebook=CODES, head_scale=10.0, input_gain=300.0, device=str(device))
    rule, moved = (build_rule(method_config(method, {}).method) for _ in range(2))
    reals = [key for key, param in rule.PARAMS.items() if isinstance(param.spec, Float) and getattr(rule, key) is not None]
    for key in reals:  # another value, inside the allowed range
        spec, value = rule.PARAMS[key].spec, getattr(rule, key)
        setattr(moved, key, next(v for v in (value * 0.9, value * 1.1, 0.05) if v != value and spec.error(key, v) is None))
    compiled = torch.compile(judge_windows, backend=backend, fullgraph=fullgraph, dynamic=False, **isolation())
    args = (target, entropy(target), drafts, draft_probs, None, noise, None)
    unequal, before, rejected = [], counters["stats"]["unique_graphs"], False
    for name, case in (("preset", rule), ("moved", moved)):
        case.setup(adapter)
        want = judge_windows(case, *args)
        rejected |= bool(want[3].min() < ROWS)
        with torch.compiler.set_stance("fail_on_recompile" if case is moved else "default"):
            got = compiled(case.with_tensor_params(device), *args)
        unequal += [f"{name}: {out}" for out, g, w in zip(OUTPUTS, got, want, strict=True) if not torch.equal(g, w)]
    graphs = counters["stats"]["unique_graphs"] - before
    if graphs != 1:  # 0: dynamo ran it eagerly (past its recompile limit on a torch without isolate_recompiles)
        unequal.append(f"graphs: {graphs}, not 1 (compiled once, replayed for the moved values)")
    return {"equal": not unequal, "unequal": unequal, "graphs": graphs, "rejected": rejected,
            "values": {"preset": rule.param_values(), "moved": moved.param_values()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.rule_exactness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager", "eager"),
                        help="torch.compile backend of the compiled verification")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--methods", nargs="+", default=None, help="conf/method/ presets (default: one per rule class)")
    args = parser.parse_args(argv)
    presets = rule_presets()
    methods = args.methods or presets
    unknown = sorted(set(methods) - set(presets))
    if unknown:
        parser.error(f"--methods: {unknown} name no rule class preset; choose from {', '.join(presets)}")
    device, failed = resolve_device(args.device), 0
    for method in methods:
        result = judge_case(method, args.backend, device, fullgraph=False)
        failed += not result["equal"]
        verdict = "equal" if result["equal"] else "DIFFERS: " + ", ".join(result["unequal"])
        print(f"{method}: {verdict} ({result['graphs']} graph(s); {args.backend} on {device})", flush=True)
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
