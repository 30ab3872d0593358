"""File formats -> one stream of records: JSONL, Parquet, CSV/TSV, a `datasets` save_to_disk
directory, a Hugging Face Hub id, or an archive holding one of them.

Every reader streams: JSONL line by line with a hard line-length cap (a 100 MB line is
skipped in 1 MB reads, never held), Parquet and Arrow in record batches, CSV row by
row. The format comes from the file's content (magic bytes), checked against its
extension; a directory must be a `save_to_disk` directory.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..domain.issues import Issue
from ..domain.rows import BOM
from .archives import ArchiveLimits, SourceError, archive_kind, unpack
from .source import Record, Source
from .spreadsheets import CsvSource, sniff_delimiter

__all__ = ["ArrowDirSource", "CsvSource", "HubSource", "JsonlSource", "ParquetSource", "Record", "Source",
           "check_name", "hub_id", "known_suffix", "open_source", "suffix_of"]

FORMAT_BY_SUFFIX = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet",
                    ".pq": "parquet", ".csv": "csv", ".tsv": "tsv"}
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".gz")
_HUB_ID = re.compile(r"^(?:hf://(?:datasets/)?)?([A-Za-z0-9][\w.-]*/[\w.-]+)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# ----------------------------------------------------------------------------- names


def check_name(name: str) -> Issue | None:
    """Dataset names are labels, never paths."""
    if not name or len(name) > 255:
        return Issue("unsafe_name", "the dataset name must be 1 to 255 characters")
    if _CONTROL.search(name) or "/" in name or "\\" in name or name in (".", "..") or name.startswith(".."):
        return Issue("unsafe_name", f"the dataset name {name[:60]!r} looks like a path or has control characters; "
                     "use a plain file name such as train.jsonl")
    return None


def suffix_of(name: str) -> str:
    lowered = name.lower()
    for double in (".tar.gz",):
        if lowered.endswith(double):
            return double
    return PurePosixPath(lowered).suffix


def known_suffix(name: str) -> str:
    """The name's suffix when it is a dataset or archive format the gate reads, else "" (for storage keys)."""
    suffix = suffix_of(name)
    return suffix if suffix in FORMAT_BY_SUFFIX or suffix in ARCHIVE_SUFFIXES else ""


def hub_id(ref: str) -> str | None:
    """`org/name` or `hf://datasets/org/name` -> `org/name`; None when not a Hub id."""
    m = _HUB_ID.match(ref)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- sniffing


def _binary_at(head: bytes) -> int | None:
    """Offset of the first binary byte when the sample is binary, else None.

    Text with a stray NUL or a bad byte on some line is NOT binary: its rows are read and
    that line is reported (`binary_content`, `bad_encoding`). Binary means undecodable as
    UTF-8 beyond a cut character, or more than 1% control bytes (NUL included)."""
    controls = [i for i, b in enumerate(head) if b < 9 or 13 < b < 32]
    if len(controls) > max(1, len(head) // 100):
        return controls[0]
    try:
        head.decode("utf-8")
        return None
    except UnicodeDecodeError as exc:
        if exc.start >= len(head) - 4:      # a character cut at the end of the sample
            return None
        bad = exc.start
    rest = head[bad:bad + 64]
    return bad if sum(1 for b in rest if b >= 0x80) > len(rest) // 4 else None


def _content_kind(path: Path) -> tuple[str, bytes]:
    with open(path, "rb") as f:
        head = f.read(8192)
    if head.startswith(b"PAR1"):
        return "parquet", head
    if (a := archive_kind(head)) is not None:
        return a, head
    if head.startswith(b"ARROW1") or head.startswith(b"\xff\xff\xff\xff"):
        return "arrow", head
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise SourceError("bad_encoding", "the file is UTF-16 encoded; save it as UTF-8")
    if (at := _binary_at(head)) is not None:
        line = head[:at].count(b"\n") + 1
        raise SourceError("binary_file", f"{path.name}: binary content at line {line} (byte {at + 1}); the file is "
                          "binary, not a dataset (JSONL, Parquet or CSV)", line)
    return "text", head


def _text_format(head: bytes, suffix: str) -> str:
    if suffix in (".csv", ".tsv"):
        return suffix[1:]
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if first == b"[":
        raise SourceError("json_array", "the file is one JSON array; convert it to JSON Lines (one object per line)")
    if suffix in (".jsonl", ".ndjson", ".json") or first == b"{":
        return "jsonl"
    raise SourceError("unsupported_format", "a text file that is neither JSON Lines nor CSV (use .jsonl or .csv)")


def open_source(path: Path, *, name: str | None = None, workdir: Path, max_line_bytes: int = 8 * 1024**2,
                limits: ArchiveLimits = ArchiveLimits(), _depth: int = 0, image_line_bytes: int | None = None) -> Source:
    """Sniff and open a local file or directory; SourceError carries the rejection. A JSONL line longer
    than `max_line_bytes` that holds image parts may be up to `image_line_bytes` long."""
    name = name or path.name
    if path.is_dir():
        return ArrowDirSource.open(path)
    if not path.is_file():
        raise SourceError("unsupported_format", f"{name} is not a file")
    suffix = suffix_of(name)
    if suffix and suffix not in FORMAT_BY_SUFFIX and suffix not in ARCHIVE_SUFFIXES:
        supported = ", ".join(sorted({*FORMAT_BY_SUFFIX, *ARCHIVE_SUFFIXES}))
        raise SourceError("unsupported_format", f"unsupported file type {suffix!r}; supported: {supported}")
    if path.stat().st_size == 0:
        raise SourceError("empty_file", "the file is empty")
    kind, head = _content_kind(path)
    if kind in ("zip", "tar", "gzip"):
        if _depth:
            raise SourceError("archive_unsafe", "nested archives are refused")
        if suffix and suffix not in ARCHIVE_SUFFIXES:
            raise SourceError("extension_mismatch", f"{name} is named {suffix} but is a {kind} archive")
        inner = unpack(path, kind, name, workdir / "unpacked", limits)
        return open_source(inner, name=inner.name, workdir=workdir, max_line_bytes=max_line_bytes,
                           limits=limits, _depth=_depth + 1, image_line_bytes=image_line_bytes)
    if suffix in ARCHIVE_SUFFIXES:
        raise SourceError("extension_mismatch", f"{name} is named {suffix} but is not an archive")
    if kind == "arrow":
        raise SourceError("unsupported_format", "a bare Arrow file; upload the whole save_to_disk directory "
                          "(as .zip or .tar.gz) or Parquet")
    expected = FORMAT_BY_SUFFIX.get(suffix)
    if kind == "parquet":
        if expected not in (None, "parquet"):
            raise SourceError("extension_mismatch", f"{name} is named {suffix} but its content is Parquet")
        return ParquetSource.open(path)
    if expected == "parquet":
        raise SourceError("extension_mismatch", f"{name} is named {suffix} but its content is text, not Parquet")
    fmt = _text_format(head, suffix)
    if fmt == "jsonl":
        return JsonlSource(path, max_line_bytes, image_line_bytes)
    return CsvSource(path, max_line_bytes, delimiter=sniff_delimiter(path, default="\t" if fmt == "tsv" else ","))


# ------------------------------------------------------------------------------ JSONL


class JsonlSource(Source):
    def __init__(self, path: Path, max_line_bytes: int, image_line_bytes: int | None = None) -> None:
        super().__init__("jsonl", total=path.stat().st_size)
        self.path, self.max_line_bytes = path, max_line_bytes
        self.image_line_bytes = max(image_line_bytes or 0, max_line_bytes)

    def records(self) -> Iterator[Record]:
        limit = self.max_line_bytes
        with open(self.path, "rb", buffering=1 << 20) as f:
            line = 0
            while True:
                raw = f.readline(limit + 1)
                if not raw:
                    return
                line += 1
                self.done += len(raw)
                if line == 1 and raw.startswith(BOM):
                    raw = raw[len(BOM):]
                    self.notes.append(Issue("bom_stripped", "the file starts with a UTF-8 byte-order mark (as Windows "
                                            "editors write it); it was stripped", 1))
                longest = limit
                if len(raw) > limit and not raw.endswith(b"\n") and self.image_line_bytes > limit \
                        and b'"image_url"' in raw:       # images as base64: a longer line is allowed
                    longest = self.image_line_bytes
                    more = f.readline(longest - len(raw) + 1)
                    self.done += len(more)
                    raw += more
                if len(raw) > longest and not raw.endswith(b"\n"):
                    self.done += _skip_rest_of_line(f)
                    yield Record(line, issue=Issue("line_too_long", f"line is longer than {longest} bytes", line))
                    continue
                raw = raw.rstrip(b"\r\n")
                if not raw.strip():
                    self.blank_lines += 1
                    continue
                yield Record(line, raw=raw)


def _skip_rest_of_line(f: io.BufferedReader) -> int:
    skipped = 0
    while True:
        chunk = f.readline(1 << 20)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


# ---------------------------------------------------------------------- Parquet/Arrow


def _strip_none(value: Any) -> Any:
    """Arrow fills absent struct fields with null; an absent optional key is what was meant."""
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


class ParquetSource(Source):
    def __init__(self, path: Path, parquet_file) -> None:
        super().__init__("parquet", total=parquet_file.metadata.num_rows, unit="rows")
        self.path, self.file = path, parquet_file

    @classmethod
    def open(cls, path: Path) -> ParquetSource:
        import pyarrow.parquet as pq  # noqa: PLC0415

        try:
            return cls(path, pq.ParquetFile(path))
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise SourceError("unreadable_file", f"the Parquet file cannot be read: {str(exc)[:200]}") from exc

    def records(self) -> Iterator[Record]:
        line = 0
        try:
            for batch in self.file.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    line += 1
                    self.done += 1
                    yield Record(line, row=_strip_none(row))
        except Exception as exc:
            yield Record(line + 1, issue=Issue("unreadable_file", f"the Parquet file breaks at row {line + 1}: "
                                               f"{str(exc)[:200]}", line + 1))


_VALIDATION_SPLITS = ("validation", "valid", "val", "dev")


class ArrowDirSource(Source):
    """A `datasets` save_to_disk directory: a Dataset (state.json) or a DatasetDict (dataset_dict.json).

    Rows of the train split are numbered from 1, rows of a validation split continue the
    numbering (so every line number names exactly one row)."""

    def __init__(self, splits: list[tuple[str, int, list[Path]]], total: int | None, notes: list[Issue]) -> None:
        super().__init__("hf_disk", total=total, unit="rows", has_validation=any(o for _, o, _ in splits), notes=notes)
        self.splits = splits

    @classmethod
    def open(cls, path: Path) -> ArrowDirSource:
        notes: list[Issue] = []
        if (path / "dataset_dict.json").is_file():
            names = _read_saved(path / "dataset_dict.json", SavedDatasetDict).splits
            train = "train" if "train" in names else (names[0] if len(names) == 1 else None)
            if train is None:
                raise SourceError("unsupported_format", f"the DatasetDict has splits {names} but no 'train' split")
            val = next((s for s in _VALIDATION_SPLITS if s in names), None)
            ignored = [s for s in names if s not in (train, val)]
            if ignored:
                notes.append(Issue("ignored_splits", f"split(s) {', '.join(ignored)} ignored; only train and "
                                   "validation are used"))
            chosen = [(train, 0)] + ([(val, 1)] if val else [])
            splits = [(s, origin, _arrow_files(path / s)) for s, origin in chosen]
        elif (path / "state.json").is_file():
            splits = [("train", 0, _arrow_files(path))]
        else:
            raise SourceError("unsupported_format", "a directory that is not a `datasets` save_to_disk directory "
                              "(no dataset_dict.json or state.json)")
        return cls(splits, _arrow_rows(splits), notes)

    def records(self) -> Iterator[Record]:
        import pyarrow as pa  # noqa: PLC0415

        line = 0
        for split, origin, files in self.splits:
            for f in files:
                try:
                    with pa.memory_map(str(f)) as src:
                        for batch in _arrow_batches(pa, src):
                            for row in batch.to_pylist():
                                line += 1
                                self.done += 1
                                yield Record(line, origin=origin, row=_strip_none(row))
                except (pa.ArrowException, OSError) as exc:
                    yield Record(line + 1, issue=Issue("unreadable_file", f"split {split}: {f.name} cannot be read: "
                                                       f"{str(exc)[:200]}", line + 1))


_Saved = TypeVar("_Saved", bound=BaseModel)


class SavedDatasetDict(BaseModel):
    """What a DatasetDict's dataset_dict.json says that the gate reads: its split names."""

    model_config = ConfigDict(extra="ignore")
    splits: list[str] = []


class SavedDataFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    filename: str


class SavedSplitState(BaseModel):
    """What a split's state.json says that the gate reads: the arrow files holding its rows."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    data_files: list[SavedDataFile] = Field(default=[], alias="_data_files")


def _read_saved(path: Path, model: type[_Saved]) -> _Saved:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SourceError("unreadable_file", f"{path.name} is not valid JSON") from exc
    if not isinstance(data, dict):
        raise SourceError("unreadable_file", f"{path.name} is not a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SourceError("unreadable_file", f"{path.name} is not what `datasets` writes "
                          f"({exc.error_count()} field(s) of another shape)") from exc


def _arrow_files(split_dir: Path) -> list[Path]:
    state = _read_saved(split_dir / "state.json", SavedSplitState) if (split_dir / "state.json").is_file() \
        else SavedSplitState()
    names = [d.filename for d in state.data_files]
    files = [split_dir / n for n in names if "/" not in n and ".." not in n]
    if not files:
        files = sorted(split_dir.glob("*.arrow"))
    missing = [f.name for f in files if not f.is_file()]
    if missing or not files:
        raise SourceError("unreadable_file", f"save_to_disk split {split_dir.name}: missing data file(s) "
                          f"{', '.join(missing) or '*.arrow'}")
    return files


def _arrow_batches(pa, src):
    try:
        reader = pa.ipc.open_stream(src)
    except pa.ArrowInvalid:
        src.seek(0)
        file_reader = pa.ipc.open_file(src)
        return (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
    return iter(reader)


def _arrow_rows(splits: list[tuple[str, int, list[Path]]]) -> int | None:
    import pyarrow as pa  # noqa: PLC0415

    total = 0
    try:
        for _, _, files in splits:
            for f in files:
                with pa.memory_map(str(f)) as src:
                    total += sum(b.num_rows for b in _arrow_batches(pa, src))
    except (pa.ArrowException, OSError):
        return None
    return total


# -------------------------------------------------------------------------------- Hub


class HubSource(Source):
    """A Hub dataset id, streamed with `datasets` when the Hub is reachable."""

    def __init__(self, dataset_id: str, streams: list[tuple[str, int, Any]]) -> None:
        super().__init__("hub", unit="rows", has_validation=len(streams) > 1)
        self.dataset_id, self.streams = dataset_id, streams

    @classmethod
    def open(cls, dataset_id: str, revision: str | None = None) -> HubSource:
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or \
                os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes"):
            raise SourceError("hub_unreachable", f"{dataset_id} is a Hub id but the Hub is offline here "
                              "(HF_HUB_OFFLINE); upload the data as a file")
        try:
            from huggingface_hub import HfApi  # noqa: PLC0415

            HfApi().dataset_info(dataset_id, revision=revision, timeout=10)
        except Exception as exc:
            code = "hub_error" if type(exc).__name__ in ("RepositoryNotFoundError", "RevisionNotFoundError",
                                                         "GatedRepoError") else "hub_unreachable"
            raise SourceError(code, f"Hub dataset {dataset_id}: {type(exc).__name__}: {str(exc)[:200]}") from exc
        try:
            from datasets import load_dataset  # noqa: PLC0415

            dd = load_dataset(dataset_id, revision=revision, streaming=True)
        except Exception as exc:
            raise SourceError("hub_error", f"Hub dataset {dataset_id} cannot be loaded: {str(exc)[:200]}") from exc
        names = list(dd.keys())
        train = "train" if "train" in names else names[0]
        val = next((s for s in _VALIDATION_SPLITS if s in names), None)
        streams = [(train, 0, dd[train])] + ([(val, 1, dd[val])] if val else [])
        return cls(dataset_id, streams)

    def records(self) -> Iterator[Record]:
        line = 0
        for split, origin, stream in self.streams:
            try:
                for row in stream:
                    line += 1
                    self.done += 1
                    yield Record(line, origin=origin, row=_strip_none(row))
            except Exception as exc:
                yield Record(line + 1, issue=Issue("hub_error", f"split {split} broke off: {str(exc)[:200]}", line + 1))
