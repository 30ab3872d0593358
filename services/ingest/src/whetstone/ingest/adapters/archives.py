"""Safe unpacking of uploaded archives (.zip, .tar, .tar.gz/.tgz, .gz).

Zip bombs and hostile archives are rejected, never unpacked blindly: the member count,
the total unpacked size and the compression ratio are limited WHILE decompressing
(declared sizes can lie), and members that are links, devices, absolute paths, escape
with `..`, or are themselves archives are refused.
"""

from __future__ import annotations

import gzip
import shutil
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from ..domain.issues import Issue

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".gz")
_CHUNK = 1 << 20
MAX_HEADER_BYTES = 64 * 1024          # a GNU long name / pax header (real ones are a few hundred bytes)
_EXTENDED_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                     tarfile.SOLARIS_XHDTYPE)


class SourceError(Exception):
    """The upload cannot become a record stream; carries the rejection issue."""

    def __init__(self, code: str, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.issue = Issue(code, message, line)


@dataclass(frozen=True)
class ArchiveLimits:
    max_bytes: int = 8 * 1024**3          # total unpacked
    max_ratio: float = 200.0              # unpacked / packed, checked once past ratio_floor bytes
    ratio_floor: int = 16 * 1024**2
    max_members: int = 10_000
    # (code, message) when max_bytes is the free disk rather than the operator's limit (usecases/gates.py)
    over_disk: tuple[str, str] | None = None

    def too_big(self, what: str) -> SourceError:
        if self.over_disk is not None:
            return SourceError(*self.over_disk)
        return SourceError("archive_bomb", f"archive {what} more than {self.max_bytes} bytes")


def archive_kind(head: bytes) -> str | None:
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if len(head) > 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def _safe_member_name(name: str) -> bool:
    if not name or "\x00" in name or name.startswith(("/", "\\")) or "\\" in name:
        return False
    parts = PurePosixPath(name).parts
    return ".." not in parts and not (parts and parts[0].endswith(":"))


def _is_junk(name: str) -> bool:
    """macOS metadata, wherever it sits: `__MACOSX/` trees, AppleDouble `._name` files, `.DS_Store`."""
    parts = PurePosixPath(name).parts
    return bool(parts) and ("__MACOSX" in parts or parts[-1].startswith("._") or parts[-1] == ".DS_Store")


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses GNU long-name/long-link and pax headers over MAX_HEADER_BYTES BEFORE tarfile
    reads them into memory (it allocates whatever size the header declares)."""

    def _proc_member(self, tarfile_):  # type: ignore[override]
        if self.type in _EXTENDED_HEADERS and self.size > MAX_HEADER_BYTES:
            raise SourceError("archive_invalid", f"archive header of {self.size} bytes (a GNU long name or pax "
                              f"header; limit {MAX_HEADER_BYTES}): refusing a corrupt or hostile tar")
        return super()._proc_member(tarfile_)


class _Budget:
    def __init__(self, limits: ArchiveLimits, packed: int) -> None:
        self.limits, self.packed, self.written = limits, max(1, packed), 0

    def charge(self, n: int) -> None:
        self.written += n
        lim = self.limits
        if self.written > lim.max_bytes:
            raise lim.too_big("unpacks to")
        if self.written > lim.ratio_floor and self.written / self.packed > lim.max_ratio:
            raise SourceError("archive_bomb", f"archive expands more than {lim.max_ratio:g}x "
                              f"({self.packed} packed bytes -> over {self.written}): refusing a likely zip bomb")


def _copy(src: IO[bytes], dest: Path, budget: _Budget) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        while block := src.read(_CHUNK):
            budget.charge(len(block))
            out.write(block)


def _unzip(path: Path, dest: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(limits, path.stat().st_size)
    with zipfile.ZipFile(path) as z:
        infos = [i for i in z.infolist() if not _is_junk(i.filename)]
        if len(infos) > limits.max_members:
            raise SourceError("archive_bomb", f"archive has {len(infos)} members (limit {limits.max_members})")
        if sum(i.file_size for i in infos) > limits.max_bytes:
            raise limits.too_big("declares unpacked sizes of")
        for info in infos:
            mode = info.external_attr >> 16
            if not _safe_member_name(info.filename) or stat.S_ISLNK(mode):
                raise SourceError("archive_unsafe", f"archive member {info.filename[:100]!r} is a link or escapes the archive")
            if info.is_dir():
                continue
            with z.open(info) as member:
                _copy(member, dest / info.filename, budget)


def _untar(path: Path, dest: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(limits, path.stat().st_size)
    with tarfile.open(path, "r:*", tarinfo=_BoundedTarInfo) as tar:
        count = 0
        for member in tar:
            if _is_junk(member.name):
                continue
            count += 1
            if count > limits.max_members:
                raise SourceError("archive_bomb", f"archive has more than {limits.max_members} members")
            if not _safe_member_name(member.name) or not (member.isfile() or member.isdir()):
                raise SourceError("archive_unsafe", f"archive member {member.name[:100]!r} is a link, device "
                                  "or escapes the archive")
            if member.isfile():
                src = tar.extractfile(member)
                assert src is not None
                _copy(src, dest / member.name, budget)


def _gunzip(path: Path, dest: Path, name: str, limits: ArchiveLimits) -> None:
    budget = _Budget(limits, path.stat().st_size)
    inner = name[:-3] if name.endswith(".gz") else name + ".out"
    with gzip.open(path, "rb") as src:
        _copy(src, dest / PurePosixPath(inner).name, budget)


def _gzip_holds_tar(path: Path) -> bool:
    with gzip.open(path, "rb") as f:
        return archive_kind(f.read(512)) == "tar"


def _dataset_root(dest: Path) -> Path:
    markers = sorted((p for p in dest.rglob("*") if p.name in ("dataset_dict.json", "state.json")),
                     key=lambda p: len(p.parts))
    if markers:
        return markers[0].parent
    files = [p for p in dest.rglob("*") if p.is_file()]
    if not files:
        raise SourceError("archive_invalid", "the archive holds no files")
    if len(files) > 1:
        raise SourceError("archive_invalid", f"the archive holds {len(files)} files; pack ONE dataset file "
                          "or one `save_to_disk` directory")
    return files[0]


def unpack(path: Path, kind: str, name: str, dest: Path, limits: ArchiveLimits) -> Path:
    """Unpack `path` into `dest`; return the dataset file or save_to_disk directory inside."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "zip":
            _unzip(path, dest, limits)
        elif kind == "tar" or (kind == "gzip" and _gzip_holds_tar(path)):
            _untar(path, dest, limits)
        else:
            _gunzip(path, dest, name, limits)
    except SourceError:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    except (zipfile.BadZipFile, tarfile.TarError, gzip.BadGzipFile, EOFError, OSError, ValueError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise SourceError("archive_invalid", f"the archive cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from exc
    root = _dataset_root(dest)
    if root.is_file():
        with open(root, "rb") as f:
            if archive_kind(f.read(512)):
                raise SourceError("archive_unsafe", "the archive contains another archive; nested archives are refused")
    return root
