"""The run directory: per-image records, images, and resume.

Layout of a run directory (everything later stages read; they never touch engine internals)::

    <run_dir>/
      config.yaml        the resolved Hydra config of the run
      run.json           method, model protocol facts (adapter.describe()), dataset, versions, batch size,
                         the last generate pass's throughput and batch-1 latency probe (csd.pipeline)
      records.jsonl      one JSON object per finished image (fields: see ImageRecord); a sharded run
                         (dataset.num_shards > 1) has one records.shard-<k>-of-<n>.jsonl per shard instead
      images/<prompt_id>_s<sample>.png
                         the generate stage's PNG of each record, for the user; no later stage needs it: an image is
                         a deterministic decode of its record's tokens (csd.decode), which readers decode when the
                         PNG is missing and ``stage=decode`` writes again, byte for byte
      metrics.json       written by the evaluate stage
      fingerprint.json   what determines the images (csd.rundir); a resume with other values is refused
      .lock              held by the process generating into the directory (csd.lockfile)
      records.rejected.jsonl  record lines a resume could not use (unreadable, duplicate, other settings)

A record line is written with a single ``write`` + ``fsync`` (after its PNG is in place), so an
interrupted run leaves at most one incomplete trailing line, which :func:`load_records` drops (and
:class:`RecordWriter` truncates away before appending). Any other unreadable line is an error for
readers; a resume moves it to ``records.rejected.jsonl`` and regenerates its image. A record does not depend on
its PNG: one that is missing or broken is decoded from the record's tokens.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Container, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from csd.errors import RecordsError

log = logging.getLogger(__name__)
RECORDS_FILE = "records.jsonl"
SHARD_RECORDS_GLOB = "records.shard-*-of-*.jsonl"
REJECTED_FILE = "records.rejected.jsonl"
IMAGES_DIR = "images"
#: record fields resume and evaluation cannot do without
KEY_FIELDS = ("prompt_id", "sample", "image")
#: why a resume sets a record line aside, and what happens to its image
REJECT_KINDS = {
    "unreadable": "unreadable; their images will be generated again",
    "repeated": "repeats of an image already recorded (the first record of each is kept)",
    "other settings": "records made with other settings than the run's (method, model or method_params); "
                      "their images will be generated again",
}
#: the run.json fields every record of the run must repeat (:func:`settings_mismatch`)
SETTINGS_FIELDS = ("method", "model", "method_params")
#: method keys added after runs were made, with the value those runs used without recording it
IMPLICIT_METHOD_PARAMS = {
    "draft_record": "onehot", "tree_width": 1, "tree_depth": 1, "pac_code_parity": False,
}

#: per-token record fields -> the dtype a compact record holds them in (:func:`compact_record`): exact for every
#: model's ids (below 2**31), iterations and kinds; entropies keep the float64 JSON gives
PER_TOKEN_FIELDS = {"tokens": np.int32, "commit_iter": np.int32, "commit_kind": np.int8, "entropy": np.float64}
#: values of ``ImageRecord.commit_kind``: how each body position was committed
COMMIT_SAMPLED, COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_FORCED = 0, 1, 2, 3


@dataclass
class ImageRecord:
    """Everything measured for one generated image.

    Counters follow docs/EVALUATION.md: ``nfe`` counts target forwards during image decoding (CFG rows
    batched = one), ``step_compression = len(tokens) / nfe`` (forced tokens included).
    ``drafts_proposed`` counts free-position drafts placed in windows, ``drafts_verified`` those the
    rule looked at (up to and including the first rejection), ``drafts_accepted`` those accepted,
    ``relaxed_accepts`` accepted drafts the lossless rule ``min(1, q/p)`` would have rejected with
    the same uniform. ``filter_checks`` / ``filter_passes``: CSD's TV filter on verified drafts.
    ``residual_fallbacks``: replacements drawn from the rule's fallback law because its residual had no
    mass (LANTERN's ``code_parity``: uniform over the codes; 0 in records made before the counter).
    ``drafter_forwards``: forwards of the drafter's own model (``drafter=draft_model``; the EAGLE head's, ``drafter=eagle``; 0 for drafters without one and
    in records made before the counter); ``nfe`` counts the target's only. ``skipped``: drafting rounds committed without a
    target forward of their own (``drafter.skip``, VVS; 0 otherwise and in records made before the counter): ``nfe``
    and ``step_compression`` count target forwards only, so a skip raises the compression.
    Per body position: ``commit_iter`` (iteration that committed it), ``commit_kind``
    (COMMIT_* above), ``entropy`` (nats of the processed target distribution it was committed under).
    ``prefill_s``, ``decode_s``, ``latency_s`` are per-image (batch-1) times, null when the image was
    decoded with ``batch_size > 1`` images in flight (run.json then holds the run's throughput); ``drafter_s`` is
    the part of ``decode_s`` spent in the drafter's propose and refresh steps (null when batched and in records made
    before it; records made before 2026-12-03 count the propose step only).
    """

    prompt_id: str
    prompt: str
    sample: int
    seed: int
    method: str
    method_params: dict[str, Any]
    model: str
    image: str
    tokens: list[int]
    grid: list[int]
    nfe: int
    iterations: int
    step_compression: float
    drafts_proposed: int
    drafts_verified: int
    drafts_accepted: int
    relaxed_accepts: int
    filter_checks: int
    filter_passes: int
    prefill_s: float | None
    decode_s: float | None
    vq_decode_s: float
    latency_s: float | None
    commit_iter: list[int]
    commit_kind: list[int]
    entropy: list[float]
    meta: dict[str, Any]
    batch_size: int = 1
    residual_fallbacks: int = 0
    drafter_forwards: int = 0
    drafter_s: float | None = None
    skipped: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt_id, self.sample)


def image_name(prompt_id: str, sample: int) -> str:
    return f"{IMAGES_DIR}/{prompt_id}_s{sample}.png"


def record_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of each newline-terminated line of ``path``, read one at a time (an incomplete trailing
    line from a crash is left out; lines end at ``\n`` only, not at ``\r``)."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if line.endswith(b"\n"):
                yield number, line


def complete_lines(path: Path) -> list[bytes]:
    """The newline-terminated lines of ``path`` (an incomplete trailing line from a crash is left out)."""
    return [line for _, line in record_lines(path)]


def parse_record(line: bytes) -> dict[str, Any]:
    """One record line as a dict; ``ValueError`` saying why if it is not one."""
    try:
        record = json.loads(line)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"not a JSON record ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON record (a {type(record).__name__})")
    missing = [k for k in KEY_FIELDS if k not in record]
    if missing:
        raise ValueError(f"not a JSON record (no {', '.join(missing)})")
    return record


def compact_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its per-token fields (:data:`PER_TOKEN_FIELDS`) as 1-D numpy arrays of their dtypes, in place:
    ~10x less memory than lists of Python numbers (what the evaluate stage holds for every image of a run). The values
    are the same; ``ValueError`` naming the field if one is not a list of numbers its dtype holds exactly."""
    for field, dtype in PER_TOKEN_FIELDS.items():
        if field not in record:
            continue
        try:
            values = np.asarray(record[field])
            kinds = "f" if np.dtype(dtype).kind == "f" else ""
            if values.ndim != 1 or (values.size and values.dtype.kind not in "iu" + kinds):
                raise TypeError(f"a {values.dtype} array of shape {values.shape}")
            typed = values.astype(dtype)
            if not np.array_equal(typed, values, equal_nan=bool(kinds)):
                raise OverflowError(f"values past {np.dtype(dtype).name}")
        except (TypeError, ValueError, OverflowError) as err:
            raise ValueError(f"field {field!r} is not a list of {np.dtype(dtype).name} values ({err})") from None
        record[field] = typed
    return record


def shard_suffix(shard: int, num_shards: int) -> str:
    """``shard-003-of-008``: names a shard's records file and lock."""
    return f"shard-{shard:03d}-of-{num_shards:03d}"


def records_file(shard: int, num_shards: int) -> str:
    """The records file of one shard; an unsharded run (``num_shards == 1``) keeps ``records.jsonl``."""
    return RECORDS_FILE if num_shards == 1 else f"records.{shard_suffix(shard, num_shards)}.jsonl"


def record_files(run_dir: str | Path) -> list[Path]:
    """Every records file of a run: ``records.jsonl`` and the shards' files, in name order."""
    run_dir = Path(run_dir)
    return [p for p in [run_dir / RECORDS_FILE, *sorted(run_dir.glob(SHARD_RECORDS_GLOB))] if p.exists()]


def load_located_records(run_dir: str | Path, compact: bool = False,
                          keys: Container[tuple[str, int]] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(file:line, record)`` of every complete record of every records file of a run, sorted by
    (prompt_id, sample), so evaluation does not depend on completion order or on the number of shards.

    Files are read line by line. ``compact``: per-token fields as typed arrays (:func:`compact_record`); ``keys``:
    only the records of these (prompt_id, sample) pairs. Raises :class:`RecordsError` naming ``file:line`` for an
    unreadable line (an incomplete trailing line from a crash is ignored).
    """
    out = []
    for path in record_files(run_dir):
        for number, line in record_lines(path):
            try:
                record = parse_record(line)
                if keys is not None and (record["prompt_id"], record["sample"]) not in keys:
                    continue
                out.append((f"{path}:{number}", compact_record(record) if compact else record))
            except ValueError as err:
                raise RecordsError(f"{path}:{number}: {err}; resume the run (stage=generate) to set it aside and redo its image") from None
    return sorted(out, key=lambda item: (item[1]["prompt_id"], item[1]["sample"]))


def load_records(run_dir: str | Path, compact: bool = False,
                 keys: Container[tuple[str, int]] | None = None) -> list[dict[str, Any]]:
    """All complete records of a run, all shards merged (see :func:`load_located_records`: ``compact``, ``keys``)."""
    return [record for _, record in load_located_records(run_dir, compact, keys)]


def settings_mismatch(record: dict[str, Any], settings: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """Where ``record`` was made with other settings than the run's (``settings``: run.json's method, model
    and method_params): ``(field, record's value, run's value)`` of the first differing field
    (``method_params.<key>`` for a parameter), or None. A parameter one side lacks matches its
    :data:`IMPLICIT_METHOD_PARAMS` value; renamed parameters compare under their current names."""
    from csd.deprecations import (
        current_method_params,  # the rule's renamed parameters (records made before a rename)
    )

    for field in SETTINGS_FIELDS:
        ours, theirs = record.get(field), settings.get(field)
        if field == "method_params" and isinstance(ours, dict) and isinstance(theirs, dict):
            ours = current_method_params(str(record.get("method")), ours)
            theirs = current_method_params(str(settings.get("method")), theirs)
            for key in sorted(ours.keys() | theirs.keys()):
                implicit = IMPLICIT_METHOD_PARAMS.get(key)
                if ours.get(key, implicit) != theirs.get(key, implicit):
                    return f"{field}.{key}", ours.get(key), theirs.get(key)
        elif ours != theirs:
            return field, ours, theirs
    return None


#: adapters whose image codes are their own token ids (``image_token_ids = arange(vocab_size)``): a run.json written
#: before ``model_info.token_ids`` was recorded still bounds their ids by ``vocab_size``
DIRECT_ID_ADAPTERS = ("ToyAdapter", "TexturedToyAdapter", "OutlineToyAdapter", "JanusAdapter", "LlamaGenAdapter")


def body_problem(record: dict[str, Any], model_info: dict[str, Any]) -> str | None:
    """Why the run's model (run.json's ``model_info``: ``body_length``, ``grid``, ``token_ids``) cannot have made
    ``record``'s body, or None: its token count, its grid, a per-token field of another length, or a token id that is
    neither an image code's nor a forced position's (``token_ids``; for runs before it, ``vocab_size`` where the
    adapter's ids are its codes, :data:`DIRECT_ID_ADAPTERS`). What is not recorded is not checked."""
    tokens = np.asarray(record["tokens"])
    n = tokens.size
    length = model_info.get("body_length")
    if length is not None and n != length:
        return f"{n} tokens, but the model's bodies have {length}"
    grid = model_info.get("grid")
    if grid is not None and list(record.get("grid") or []) != list(grid):
        return f"grid {record.get('grid')}, but the model's is {list(grid)}"
    for field in PER_TOKEN_FIELDS:
        if field in record and len(record[field]) != n:
            return f"{len(record[field])} {field} values for {n} tokens"
    ids = model_info.get("token_ids")
    if ids is None and model_info.get("adapter") in DIRECT_ID_ADAPTERS and "vocab_size" in model_info:
        ids = {"image": [0, model_info["vocab_size"] - 1], "forced": []}
    if ids is None or n == 0:
        return None
    (lo, hi), forced = ids["image"], ids.get("forced") or []
    fits = ((tokens >= lo) & (tokens <= hi)) | np.isin(tokens, forced)
    if fits.all():
        return None
    at = int(np.argmin(fits))
    allowed = f"image codes {lo}-{hi}" + (f", forced ids {', '.join(map(str, forced))}" if forced else "")
    return f"token {tokens[at]} at position {at} is not an id the model's bodies hold ({allowed})"


def check_records_match(records: list[dict[str, Any]], info: dict[str, Any], where: list[str]) -> None:
    """Refuse records that run.json does not describe (other method, model or method_params), that repeat
    an image, or that the run's model cannot have made (:func:`body_problem`): metrics over them would mix two
    configurations or read nonsense. ``where[i]`` names ``records[i]`` (file:line). A resume sets the first two
    kinds aside (:class:`RecordWriter`), so their message says to resume."""
    model_info = info.get("model_info") or {}
    first: dict[tuple[str, int], str] = {}
    for at, record in zip(where, records, strict=True):
        key = (record["prompt_id"], record["sample"])
        if key in first:
            path, line = first[key].rsplit(":", 1)
            earlier = f"on line {line}" if at.rsplit(":", 1)[0] == path else f"at {first[key]}"
            raise RecordsError(
                f"{at}: second record of {key[0]} sample {key[1]} (first {earlier}); "
                "resume the run (stage=generate) to set it aside"
            )
        first[key] = at
        problem = body_problem(record, model_info)
        if problem:
            raise RecordsError(f"{at}: {key[0]} sample {key[1]}: {problem}; the run's model cannot have made this "
                               "record: remove its line and resume the run (stage=generate) to redo its image")
        mismatch = settings_mismatch(record, info)
        if mismatch:
            field, ours, theirs = mismatch
            raise RecordsError(
                f"{at}: {key[0]} sample {key[1]} has {field}={ours!r} but run.json says {theirs!r}; metrics "
                "would mix two configurations: resume the run (stage=generate) to set it aside and redo it"
            )


def listed(values: Any) -> Any:
    """A compact record's array as the list its JSON line holds; anything else as it is."""
    return values.tolist() if isinstance(values, np.ndarray) else values


def records_digest(records: Iterable[dict[str, Any]]) -> str:
    """sha256 of the ``(prompt_id, sample, tokens)`` of ``records`` in (prompt_id, sample) order:
    metrics.json's ``records_sha256``, which tells a later reader whether the run still holds the records
    evaluated. The bytes hashed are the compact JSON of the list of those rows (a compact record's tokens as their
    list), written one row at a time: memory is one record's, whatever the run's size."""
    digest = hashlib.sha256(b"[")
    for i, r in enumerate(sorted(records, key=lambda r: (r["prompt_id"], r["sample"]))):
        row = [r["prompt_id"], r["sample"], listed(r["tokens"])]
        digest.update((("," if i else "") + json.dumps(row, separators=(",", ":"))).encode())
    digest.update(b"]")
    return digest.hexdigest()


def png_bytes(image: np.ndarray) -> bytes:
    """The PNG file of a uint8 ``[H, W, 3]`` image, as every run writes it (PIL's PNG encoder, its default settings):
    the generate stage's and ``stage=decode``'s files are these bytes."""
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (a temporary file of this process, then a rename: readers and other writers
    never see part of a file)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass
class UsableLines:
    """The lines of one records file as a resume sees them (:func:`usable_lines`)."""

    kept: list[bytes]
    #: (prompt_id, sample) -> line number of each usable record
    done: dict[tuple[str, int], int]
    #: (kind of :data:`REJECT_KINDS`, line number, line, reason) of each line a resume sets aside
    rejected: list[tuple[str, int, bytes, str]]


def usable_lines(path: Path, settings: dict[str, Any] | None = None) -> UsableLines:
    """Which complete lines of the records file ``path`` a resume keeps, and which it sets aside: unreadable
    lines, repeats of an image already kept and records made with other ``settings`` than the run's (method,
    model, method_params; not checked when None). A record's PNG plays no part: its tokens are the image. Reads
    only: :class:`RecordWriter` moves the lines, ``stage=status`` counts them."""
    out = UsableLines([], {}, [])
    for number, line in enumerate(complete_lines(path), 1):
        try:
            record = parse_record(line)
        except ValueError as err:
            out.rejected.append(("unreadable", number, line, str(err)))
            continue
        key = (record["prompt_id"], record["sample"])
        mismatch = settings_mismatch(record, settings) if settings is not None else None
        if key in out.done:
            out.rejected.append(("repeated", number, line, f"repeats line {out.done[key]}"))
        elif mismatch:
            field, ours, theirs = mismatch
            why = f"made with other settings ({field}={ours!r}, the run's is {theirs!r})"
            out.rejected.append(("other settings", number, line, why))
        else:
            out.done[key] = number
            out.kept.append(line)
    return out


class RecordWriter:
    """Appends records and images to a run directory; knows which (prompt, sample) pairs are done.

    On opening an existing directory, record lines that cannot be used (:func:`usable_lines`; ``expected``
    holds the run's method, model and method_params, as run.json does) are moved to
    ``records.rejected.jsonl``, so their images are generated again. Readable records are never dropped:
    they stay in ``records.jsonl`` or move to the rejected file.

    ``name`` is the file it appends to (one per shard, :func:`records_file`); only that file is cleaned,
    but ``done`` also holds the images recorded in the run's other records files.
    """

    def __init__(
        self, run_dir: str | Path, name: str = RECORDS_FILE, expected: dict[str, Any] | None = None
    ) -> None:
        self.run_dir = Path(run_dir)
        (self.run_dir / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / name
        self._drop_incomplete_tail()
        self.done = self._set_aside_unusable(expected) | self._done_elsewhere()

    def _done_elsewhere(self) -> set[tuple[str, int]]:
        """The images other records files of the run hold (readable lines; each file's writer cleans it)."""
        done = set()
        for path in record_files(self.run_dir):
            if path != self.path:
                for line in complete_lines(path):
                    try:
                        record = parse_record(line)
                    except ValueError:
                        continue
                    done.add((record["prompt_id"], record["sample"]))
        return done

    def _drop_incomplete_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(keep)

    def _set_aside_unusable(self, expected: dict[str, Any] | None) -> set[tuple[str, int]]:
        """Move unusable lines to the rejected file (then rewrite records.jsonl atomically); the usable keys."""
        lines = usable_lines(self.path, expected)
        if not lines.rejected:
            return set(lines.done)
        with open(self.run_dir / REJECTED_FILE, "a", encoding="utf-8") as f:
            for _, number, line, reason in lines.rejected:
                f.write(json.dumps({"line": number, "reason": reason, "text": line.decode("utf-8", "replace")}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp = self.path.with_suffix(".jsonl.tmp")
        with open(tmp, "wb") as f:
            f.writelines(lines.kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        for kind, what in REJECT_KINDS.items():
            numbers = [str(number) for k, number, _, _ in lines.rejected if k == kind]
            if numbers:
                log.warning("%s: line(s) %s moved to %s: %s", self.path, ", ".join(numbers), REJECTED_FILE, what)
        return set(lines.done)

    def write(self, record: ImageRecord, image: np.ndarray) -> None:
        """Save the PNG (atomically), then append the record line in one write."""
        write_atomic(self.run_dir / record.image, png_bytes(image))
        line = json.dumps(asdict(record), separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.done.add(record.key)
