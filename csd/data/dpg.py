"""DPG-Bench prompts (Hu et al. 2024, ELLA, arXiv 2403.05135; ``TencentQQGYLab/ELLA``, ``dpg_bench/dpg_bench.csv``):
1,065 dense prompts, each with its questions (one CSV row per question: ``item_id``, ``text``, ``proposition_id``,
``dependency``, ``category_broad``, ``question_natural_language``), scored by ``csd.evaluation.dpg_score``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from csd.data.files import check_size, require_file
from csd.errors import DatasetFileError
from csd.prompts import Prompt

DPG_PROMPTS = 1065
COLUMNS = ("item_id", "text", "proposition_id", "dependency", "category_broad", "question_natural_language")


def _ids(value: str, path: Path, line: int) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise DatasetFileError(f"{path}:{line}: dependency {value!r} is not a comma-separated list of ids") from None


def dpg_prompts(csv_file: str | Path, n_prompts: int | None = None, **_: object) -> list[Prompt]:
    """One prompt per ``item_id`` (first-appearance order); ``meta["dpg"]["questions"]``: per question its
    ``id``, ``question``, ``category`` and ``parents`` (the ``dependency`` ids; 0 = none)."""
    path = require_file(csv_file, "DPG-Bench prompts (dpg_bench.csv)", "dataset.csv_file")
    check_size(path)
    items: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DatasetFileError(f"{path}: no {missing[0]!r} column (header: {reader.fieldnames}); is this dpg_bench.csv?")
        for row in reader:
            item = items.setdefault(row["item_id"], {"text": row["text"].strip(), "questions": []})
            try:
                qid = int(row["proposition_id"])
            except ValueError:
                raise DatasetFileError(f"{path}:{reader.line_num}: proposition_id {row['proposition_id']!r} "
                                       "is not an integer") from None
            item["questions"].append({"id": qid, "question": row["question_natural_language"],
                                      "category": row["category_broad"],
                                      "parents": _ids(row["dependency"], path, reader.line_num)})
    prompts = []
    for item_id, item in items.items():
        known = {q["id"] for q in item["questions"]}
        for q in item["questions"]:
            if unknown := [p for p in q["parents"] if p and p not in known]:
                raise DatasetFileError(f"{path}: item {item_id} question {q['id']} depends on missing question {unknown[0]}")
        prompts.append(Prompt(item_id, item["text"], {"dpg": {"questions": item["questions"]}}))
        if n_prompts is not None and len(prompts) == n_prompts:
            break
    if not prompts:
        raise DatasetFileError(f"{path}: no prompts")
    return prompts
