"""PartiPrompts (Yu et al. 2022, arXiv 2206.10789; ``google-research/parti``, ``PartiPrompts.tsv``): 1,632 prompts,
each with a ``Category`` (Abstract, Animals, ...) and a ``Challenge`` (Basic, Imagination, ...) column."""

from __future__ import annotations

import csv
from pathlib import Path

from csd.data.files import check_size, require_file
from csd.errors import DatasetFileError
from csd.prompts import Prompt

PARTI_PROMPTS = 1632
#: the TSV's columns this loader reads (the file also has ``Note``)
COLUMNS = ("Prompt", "Category", "Challenge")


def parti_prompts(tsv: str | Path, n_prompts: int | None = None, **_: object) -> list[Prompt]:
    """The prompts in file order; prompt id = ``parti-<row index:04d>``; ``meta``: ``category``, ``challenge``."""
    path = require_file(tsv, "PartiPrompts (PartiPrompts.tsv)", "dataset.tsv")
    check_size(path)
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DatasetFileError(f"{path}: no {missing[0]!r} column (header: {reader.fieldnames}); is this PartiPrompts.tsv?")
        prompts = []
        for row in reader:
            text = (row["Prompt"] or "").strip()
            if not text:
                raise DatasetFileError(f"{path}:{reader.line_num}: empty 'Prompt'")
            meta = {"index": len(prompts), "category": row["Category"], "challenge": row["Challenge"]}
            prompts.append(Prompt(f"parti-{len(prompts):04d}", text, meta))
            if n_prompts is not None and len(prompts) == n_prompts:
                break
    if not prompts:
        raise DatasetFileError(f"{path}: no prompts")
    return prompts
