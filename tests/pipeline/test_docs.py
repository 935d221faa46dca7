"""Every document the README and docs/ point to exists.

Checked in README.md, docs/*.md, tests/README.md and the toy model card: the target of every relative markdown link
(``[text](target)``, ``![alt](target)``, ``[ref]: target``) exists relative to the linking file's
folder, a ``#anchor`` into a markdown file names one of its headings, and a document named in plain
prose (``ALGORITHMS.md``) exists, relative to the file's folder or the repository root. Code spans
and fenced code blocks are not prose and are skipped.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "tests" / "README.md",
                    ROOT / "csd" / "toy" / "MODEL_CARD.md"])

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
NAMED_DOC = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (they render literally, links included)."""
    return CODE_SPAN.sub(" ", FENCE.sub("\n", text))


def link_targets(text: str) -> list[str]:
    """Targets of the inline links, images and reference definitions of a markdown text."""
    body = prose(text)
    return INLINE_LINK.findall(body) + REFERENCE_DEF.findall(body)


def named_documents(text: str) -> list[str]:
    """``*.md`` names written in prose outside any link (``see ALGORITHMS.md``)."""
    return NAMED_DOC.findall(REFERENCE_DEF.sub(" ", INLINE_LINK.sub(" ", prose(text))))


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces -> '-'."""
    anchors: set[str] = set()
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("\n", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", CODE_SPAN.sub(lambda m: m.group(0).strip("`"), title).lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def broken_links(md_file: Path) -> list[str]:
    """Problems of one markdown file: missing link targets, unknown anchors, named documents that do not exist."""
    text = md_file.read_text(encoding="utf-8")
    problems = []
    for target in link_targets(text):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (md_file.parent / path_part).resolve() if path_part else md_file
        if not dest.exists():
            problems.append(f"link to {target!r}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"link to {target!r}: {dest.name} has no heading with anchor #{anchor}")
    for name in named_documents(text):
        if not ((md_file.parent / name).exists() or (ROOT / name).exists()):
            problems.append(f"names {name!r}: no such file next to {md_file.name} or at the repository root")
    return problems


@pytest.mark.parametrize("md_file", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(md_file: Path) -> None:
    assert md_file.exists(), f"{md_file} is missing"
    assert broken_links(md_file) == []


def test_docs_are_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in link_targets(readme) if not t.startswith(EXTERNAL)}
    for name in ("ALGORITHMS.md", "MODELS.md", "EVALUATION.md", "PERFORMANCE.md", "RESULTS.md", "CLUSTER.md", "USAGE.md"):
        assert (ROOT / "docs" / name).resolve() in linked, f"README.md does not link docs/{name}"
    assert (ROOT / "tests" / "README.md").resolve() in linked, "README.md does not link tests/README.md"


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A title, with `code`\n\n## Notation\n## Notation\n", encoding="utf-8")
    (tmp_path / "img.png").write_bytes(b"")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\nSee [ok](there.md), [anchor](there.md#a-title-with-code), [dup](there.md#notation-1), ![i](img.png),\n"
        "[web](https://example.org/x.md), [self](#doc) and `missing.md` in code.\n"
        "```\n[fenced](nowhere.md)\n```\n"
        "Broken: [gone](gone.md), ![pic](pics/none.png), [bad](there.md#no-such), NOTES.md.\n"
        "[r]: ref.md\n",
        encoding="utf-8",
    )
    problems = broken_links(doc)
    assert len(problems) == 5, problems
    for bad in ("gone.md", "pics/none.png", "#no-such", "NOTES.md", "ref.md"):
        assert any(bad in p for p in problems), (bad, problems)


SOURCE_FILES = sorted(
    p for pattern in ("csd/**/*.py", "baselines/*.py", "experiments/*.py", "tests/**/*.py", "run.py", "conf/**/*.yaml")
    for p in ROOT.glob(pattern)
)
DOCS_REFERENCE = re.compile(r"\b(docs/[\w.-]+\.md)\b")


#: a document's name in prose (``ALGORITHMS.md``, ``MODEL_CARD.md``), not a generated file (``report.md``)
ANY_DOCUMENT = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]*\.md)\b")
ISSUE_NUMBER = re.compile(r"\bissue\s*#\d+|\(#\d+\)", re.I)


def test_docs_named_in_code_exist() -> None:
    """Docstrings and config comments cite ``docs/<page>.md`` or another document of the repository by name
    (the toy's model card): each cited document exists; none cites an issue number (the repository is read without
    the issue tracker)."""
    documents = {p.name for p in repository_files() if p.suffix == ".md"}
    missing, issues = [], []
    for source in SOURCE_FILES:
        if source == Path(__file__):  # this checker's own fixtures name missing documents on purpose
            continue
        text = source.read_text(encoding="utf-8")
        missing += [f"{source.relative_to(ROOT)}: {name}" for name in DOCS_REFERENCE.findall(text)
                    if not (ROOT / name).exists()]
        missing += [f"{source.relative_to(ROOT)}: {name}" for name in ANY_DOCUMENT.findall(text) if name not in documents]
        issues += [f"{source.relative_to(ROOT)}: {m}" for m in ISSUE_NUMBER.findall(text)]
    assert SOURCE_FILES and not missing, missing
    assert not issues, issues


DOTTED = re.compile(r"`((?:csd|baselines)(?:\.\w+)+)(?:\(\))?`")


def test_code_named_in_the_docs_exists() -> None:
    """Every ``csd.module.name`` / ``baselines.module.Class`` the documentation names in a code span imports."""
    import importlib

    missing = []
    for md_file in DOC_FILES:
        for dotted in set(DOTTED.findall(md_file.read_text(encoding="utf-8"))):
            parts = dotted.split(".")
            for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    missing.append(f"{md_file.name}: {dotted}")
                break
            else:
                missing.append(f"{md_file.name}: {dotted}")
    assert not missing, missing


#: the hub client's old command, retired from huggingface_hub: the installed client has ``hf`` only
RETIRED_HUB_CLI = "huggingface" + "-cli"


def repository_files() -> list[Path]:
    """The files git tracks or would track (``git ls-files``, ignored files left out), except ``results/``."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [ROOT / name for name in listed if not name.startswith("results/") and (ROOT / name).is_file()]


def test_no_file_names_the_retired_hub_cli() -> None:
    """Commands, docs and error messages say ``hf download REPO --local-dir DIR``; results/ keep their history."""
    files = repository_files()
    naming = [str(p.relative_to(ROOT)) for p in files if RETIRED_HUB_CLI.encode() in p.read_bytes()]
    assert files
    assert naming == [], f"{naming} still name {RETIRED_HUB_CLI}; the command is `hf download REPO --local-dir DIR`"
