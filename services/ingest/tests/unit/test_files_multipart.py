"""The Files API's streaming multipart receiver: the file part goes to disk in chunks, hashed,
with a byte limit; fields are small; a malformed body is refused."""

import hashlib

import pytest

from whetstone.ingest.adapters.files import (MultipartReceiver, UploadRefused, boundary_of, safe_filename,
                                             sniff_purpose)

pytestmark = pytest.mark.unit
BOUNDARY = b"----whet"


def body(file_bytes: bytes, purpose: str = "fine-tune", name: str = "file") -> bytes:
    return (b"--" + BOUNDARY + b"\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n" + purpose.encode()
            + b"\r\n--" + BOUNDARY + b"\r\nContent-Disposition: form-data; name=\"" + name.encode()
            + b"\"; filename=\"train.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n" + file_bytes
            + b"\r\n--" + BOUNDARY + b"--\r\n")


def feed(data: bytes, dest, limit: int, chunk: int = 7):
    r = MultipartReceiver(BOUNDARY, dest, limit)
    for i in range(0, len(data), chunk):  # tiny chunks: parts straddle every boundary
        r.feed(data[i:i + chunk])
    return r.finish()


def test_streams_the_file_part_to_disk_with_its_hash(tmp_path):
    payload = b'{"messages": []}\n' * 500
    got = feed(body(payload), tmp_path / "f", limit=1 << 20)
    assert got.fields == {"purpose": "fine-tune"} and got.filename == "train.jsonl" and got.file_parts == 1
    assert (tmp_path / "f").read_bytes() == payload and got.size == len(payload)
    assert got.sha256 == hashlib.sha256(payload).hexdigest()


def test_stops_at_the_byte_limit(tmp_path):
    with pytest.raises(UploadRefused) as exc:
        feed(body(b"x" * 5000), tmp_path / "f", limit=4096, chunk=1024)
    assert exc.value.status == 413 and exc.value.param == "file"
    assert (tmp_path / "f").stat().st_size <= 4096


def test_fields_are_capped_and_content_type_checked(tmp_path):
    with pytest.raises(UploadRefused):
        feed(body(b"{}", purpose="p" * 10_000), tmp_path / "f", limit=1 << 20)
    with pytest.raises(UploadRefused):
        boundary_of("application/json")
    assert boundary_of('multipart/form-data; boundary="abc"') == b"abc"
    assert feed(body(b"{}", name="other"), tmp_path / "f", limit=100).file_parts == 0


def test_purpose_sniffing_and_file_names(tmp_path):
    p = tmp_path / "x"
    p.write_text('\n{"input": {"messages": []}, "preferred_output": [], "non_preferred_output": []}\n')
    assert sniff_purpose(p) == "dpo"
    p.write_text('{"text": "hello"}\n')
    assert sniff_purpose(p) == "cpt"
    p.write_text('{"messages": []}\n')
    assert sniff_purpose(p) == "sft"
    p.write_bytes(b"PAR1\x00\x01")
    assert sniff_purpose(p) == "sft"
    assert safe_filename("../../etc/passwd") == "passwd" and safe_filename("C:\\x\\a.jsonl") == "a.jsonl"
    assert safe_filename(None) == "upload.jsonl" and safe_filename("a\x00b.jsonl") == "ab.jsonl"


def test_the_disk_is_measured_again_while_the_file_streams_in(tmp_path):
    """Another upload filling the same disk meanwhile: the budget shrinks and the upload stops as the disk's."""
    from whetstone.ingest.domain.storage import Disk, write_budget

    seen: list[int] = []

    def remeasure(written: int):
        seen.append(written)
        return write_budget(1 << 20, Disk(free=3000, reserve=0))   # the disk filled up to 3000 bytes of room

    r = MultipartReceiver(BOUNDARY, tmp_path / "f", write_budget(1 << 20, Disk(free=1 << 30, reserve=0)),
                          remeasure, recheck_bytes=2048)
    data = body(b"x" * 6000)
    with pytest.raises(UploadRefused) as exc:
        for i in range(0, len(data), 1024):
            r.feed(data[i:i + 1024])
    assert (exc.value.status, exc.value.code) == (507, "insufficient_storage") and seen and seen[0] >= 2048
    r.close()
