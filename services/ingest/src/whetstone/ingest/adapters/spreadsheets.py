"""CSV/TSV as spreadsheets write them (Excel, pandas, Google Sheets, LibreOffice)."""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..domain.issues import Issue
from ..domain.rows import BOM, decode_json
from .source import Record, Source

_JSON_CELLS = ("messages", "prompt", "chosen", "rejected", "conversations", "tools", "preferred_output",
               "non_preferred_output", "input", "history")
_DELIMITERS = (",", ";", "\t")
_INDEX_COLUMN = re.compile(r"^(|Unnamed: 0|index)$")
_SURROGATE = re.compile("[\udc80-\udcff]")



def _decode_cells(row: dict[str, str]) -> dict[str, Any]:
    """JSON-looking cells of the columns that hold lists/objects (messages, chosen, ...) are decoded."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in _JSON_CELLS and value.lstrip()[:1] in ("[", "{"):
            try:
                decoded = decode_json(value)
                if key != "input" or isinstance(decoded, dict):   # Alpaca's `input` is text
                    value = decoded
            except (ValueError, RecursionError):
                pass
        out[key] = value
    return out


def sniff_delimiter(path: Path, default: str) -> str:
    """Comma, semicolon or tab: the one that splits the first records into the same number of
    columns (more than one) most often; `default` when none does."""
    with open(path, "rb") as f:
        sample = f.read(64 * 1024)
    text = sample.removeprefix(BOM).decode("utf-8", "replace")
    if len(sample) == 64 * 1024:
        text = text[: text.rfind("\n") + 1] or text
    best, best_score = default, (0, 0)
    for delimiter in _DELIMITERS:
        try:
            widths = [len(r) for r in itertools.islice(csv.reader(io.StringIO(text), delimiter=delimiter), 50) if r]
        except csv.Error:
            continue
        if not widths or widths[0] < 2:
            continue
        score = (sum(w == widths[0] for w in widths), widths[0])
        if score > best_score:
            best, best_score = delimiter, score
    return best


class _CountingReader(io.RawIOBase):
    def __init__(self, f: io.BufferedReader, source: Source) -> None:
        self.f, self.source = f, source

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self.f.readinto(b)
        self.source.done += n or 0
        return n


class CsvSource(Source):
    """CSV/TSV as spreadsheets write them: a UTF-8 BOM (Excel's "CSV UTF-8") is skipped, the
    delimiter is sniffed (comma, semicolon, tab), quoted cells may hold newlines, and a leading
    unnamed index column (pandas `to_csv`) is dropped. Lines are CSV records' first lines."""

    def __init__(self, path: Path, max_line_bytes: int, delimiter: str = ",") -> None:
        super().__init__("csv" if delimiter != "\t" else "tsv", total=path.stat().st_size)
        self.path, self.max_line_bytes, self.delimiter = path, max_line_bytes, delimiter
        self.dialect = f"delimiter {delimiter!r}"

    def records(self) -> Iterator[Record]:
        csv.field_size_limit(self.max_line_bytes)
        with open(self.path, "rb") as raw:
            raw.seek(3 if raw.read(3) == BOM else 0)
            text = io.TextIOWrapper(io.BufferedReader(_CountingReader(raw, self)), encoding="utf-8",
                                    errors="surrogateescape", newline="")
            reader = csv.reader(text, delimiter=self.delimiter)
            header: list[str] | None = None
            skip_index = False
            while True:
                start = reader.line_num + 1
                try:
                    cells = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    yield Record(start, issue=Issue("line_too_long" if "larger than field limit" in str(exc)
                                                    else "unreadable_file", f"CSV error: {exc}", start))
                    continue
                if header is None:
                    header = cells
                    if _SURROGATE.search("".join(cells)):
                        yield Record(start, issue=Issue("bad_encoding", "the header is not valid UTF-8", start))
                    skip_index = len(header) > 1 and bool(_INDEX_COLUMN.match(header[0].strip()))
                    if skip_index:
                        header = header[1:]
                        self.dialect += ", leading index column dropped"
                    continue
                if not any(c.strip() for c in cells):
                    self.blank_lines += 1
                    continue
                yield self._record(start, header, cells[1:] if skip_index else cells)

    def _record(self, line: int, header: list[str], cells: list[str]) -> Record:
        joined = "".join(cells)
        if "\x00" in joined:
            return Record(line, issue=Issue("binary_content", "the row holds a NUL byte: binary or corrupt content",
                                            line))
        if _SURROGATE.search(joined):
            return Record(line, issue=Issue("bad_encoding", "the row is not valid UTF-8", line))
        if len(cells) > len(header):
            return Record(line, issue=Issue("unreadable_file", f"row has {len(cells)} columns, the header "
                                            f"{len(header)} (read with {self.dialect})", line))
        return Record(line, row=_decode_cells(dict(zip(header, cells))))
