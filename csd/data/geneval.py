"""GenEval prompts (``evaluation_metadata.jsonl``) and the export to the official evaluator's layout."""

from __future__ import annotations

import json
from pathlib import Path

from csd.data.files import check_size, require_file
from csd.errors import DatasetFileError
from csd.prompts import Prompt
from csd.records import load_records, png_bytes

GENEVAL_PROMPTS = 553


def geneval_prompts(metadata: str | Path, n_prompts: int | None = None, **_: object) -> list[Prompt]:
    """The GenEval prompts in file order; prompt id = the 5-digit line index the evaluator uses.

    ``meta`` holds ``index`` and the untouched metadata line (``tag``, ``include``, ``exclude``,
    ``prompt``) under ``geneval``, which :func:`export_geneval` writes back out.
    """
    path = require_file(metadata, "GenEval metadata (evaluation_metadata.jsonl)", "dataset.metadata")
    check_size(path)
    prompts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetFileError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
                raise DatasetFileError(f"{path}:{lineno}: no 'prompt' string in this entry")
            index = len(prompts)
            prompts.append(Prompt(f"{index:05d}", entry["prompt"], {"index": index, "geneval": entry}))
            if n_prompts is not None and len(prompts) == n_prompts:
                break
    if not prompts:
        raise DatasetFileError(f"{path}: no prompts (the file has no entries)")
    return prompts


def export_geneval(run_dir: str | Path, outdir: str | Path) -> Path:
    """Write a finished run's images as ``<outdir>/<index:05d>/{metadata.jsonl, samples/<sample:04d>.png}`` (the run's
    PNGs, or for those it lacks the decodes of their records, byte for byte the PNGs the run wrote).

    That is the folder layout GenEval's ``evaluate_images.py`` reads; scoring itself needs the
    official detector stack and is run outside this harness.
    """
    from csd.decode import RunImages  # builds the run's model only for images without a PNG

    run_dir, outdir = Path(run_dir), Path(outdir)
    records = load_records(run_dir)
    images = RunImages(run_dir, records)
    if not records:
        raise FileNotFoundError(f"no records in {run_dir}: run the generate stage first")
    for rec in records:
        meta = rec["meta"]
        if "geneval" not in meta:
            raise ValueError(f"record {rec['prompt_id']} has no GenEval metadata: was the run made with dataset=geneval?")
        prompt_dir = outdir / f"{meta['index']:05d}"
        (prompt_dir / "samples").mkdir(parents=True, exist_ok=True)
        (prompt_dir / "metadata.jsonl").write_text(json.dumps(meta["geneval"]) + "\n", encoding="utf-8")
        (prompt_dir / "samples" / f"{rec['sample']:04d}.png").write_bytes(png_bytes(images.array(rec)))
    return outdir
