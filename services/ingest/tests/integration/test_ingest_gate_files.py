"""The data gate on real files (no stack): formats, the error catalogue and bad input
(test_ingest_gate_screening.py: dedup, screening, tokenization, the CLI)."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from whetstone.ingest.adapters.archives import SourceError
from whetstone.ingest.adapters.formats import HubSource, check_name
from whetstone.ingest.config import IngestSettings
from whetstone.ingest.usecases.gates import GateRequest

pytestmark = pytest.mark.integration


def rejected_with(tmp_path, kit, path: Path, code: str, **kw) -> str:
    with pytest.raises(SourceError) as exc:
        kit.run_gate(path, tmp_path, **kw)
    assert exc.value.issue.code == code, exc.value.issue
    return exc.value.issue.message


# ------------------------------------------------------------------------- formats


def test_chat_jsonl_accepted_with_split_stats_and_cost(tmp_path, kit):
    path = kit.write_jsonl(tmp_path / "d.jsonl", kit.good_rows(60) + [b"", b"   "])
    result = kit.run_gate(path, tmp_path)
    r = result.report.as_dict()
    assert r["accepted"] and r["format"] == "jsonl" and r["schema"] == "chat" and r["purpose"] == "sft"
    assert r["rows_total"] == 60 and r["rows_kept"] == 60 == r["train_rows"] + r["validation_rows"]
    assert r["validation_rows"] > 0
    train, val = kit.read_jsonl(result.train_path), kit.read_jsonl(result.validation_path)
    assert all(set(row) == {"messages"} for row in train + val)
    again = kit.run_gate(path, tmp_path / "again")
    assert kit.read_jsonl(again.validation_path) == val  # the split is deterministic
    assert r["warning_counts"]["blank_lines"] == 1 and r["warning_counts"]["tokens_estimated"] == 1
    assert r["stats"]["roles"] == {"assistant": 60, "user": 60} and r["stats"]["turns"] == {"2": 60}
    assert r["stats"]["token_histogram"][0]["min"] == 0 and r["tokens_total"] > 0
    cost = r["cost_estimate"]
    assert cost["tokens"] < r["tokens_total"] and cost["epochs"] == 3 and cost["estimates"]
    assert {"gpu_type", "method", "gpu_hours", "on_demand_usd", "spot_usd"} <= set(cost["cheapest"])


@pytest.mark.parametrize("rows, schema, purpose", [
    ([{"prompt": f"p{i}?", "completion": f"c{i}."} for i in range(12)], "prompt_completion", "sft"),
    ([{"instruction": f"do {i}", "input": "" if i % 2 else f"x{i}", "output": f"done {i}"} for i in range(12)],
     "instruction", "sft"),
    ([{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(12)], "preference", "dpo"),
    ([{"prompt": [{"role": "user", "content": f"q{i}"}], "chosen": [{"role": "assistant", "content": f"good {i}"}],
       "rejected": [{"role": "assistant", "content": f"bad {i}"}]} for i in range(12)], "preference", "dpo"),
    ([{"text": f"Plain text document number {i} for continued pre-training."} for i in range(12)], "text", "cpt"),
])
def test_every_schema_is_detected_and_normalized(tmp_path, kit, rows, schema, purpose):
    result = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", rows), tmp_path)
    r = result.report.as_dict()
    assert r["accepted"], r["errors"]
    assert r["schema"] == schema and r["purpose"] == purpose and r["rows_kept"] == 12
    out = kit.read_jsonl(result.train_path)
    if schema in ("prompt_completion", "instruction"):
        assert all(set(o) == {"messages"} and o["messages"][-1]["role"] == "assistant" for o in out)
        assert "chat" in r["notes"][0]
    elif schema == "preference":
        assert all(isinstance(o["prompt"], list) and o["chosen"][0]["role"] == "assistant" for o in out)
    else:
        assert all(set(o) == {"text"} for o in out)


def test_eval_purpose_keeps_every_row_for_evaluation(tmp_path, kit):
    result = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", kit.good_rows(15)), tmp_path,
                          request=GateRequest(purpose="eval"))
    r = result.report.as_dict()
    assert r["accepted"] and r["purpose"] == "eval" and r["validation_rows"] == 15 and result.train_path is None
    assert r["cost_estimate"] is None


def test_parquet_csv_tsv_and_archives(tmp_path, kit):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = kit.good_rows(20)
    rows[3]["messages"][1]["weight"] = 0
    rows[3]["messages"].append({"role": "user", "content": "and?"})
    rows[3]["messages"].append({"role": "assistant", "content": "and that is all.", "weight": 1})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    r = kit.run_gate(tmp_path / "d.parquet", tmp_path / "pq").report.as_dict()
    assert r["accepted"] and r["format"] == "parquet" and r["schema"] == "chat" and r["rows_kept"] == 20, r["errors"]

    csv_text = "prompt,completion\n" + "".join(f'"line {i}, with comma","answer\nover two lines {i}"\n'
                                               for i in range(12))
    (tmp_path / "d.csv").write_text(csv_text)
    r = kit.run_gate(tmp_path / "d.csv", tmp_path / "csv").report.as_dict()
    assert r["accepted"] and r["format"] == "csv" and r["schema"] == "prompt_completion", r["errors"]
    (tmp_path / "d.tsv").write_text("text\n" + "".join(f"document {i} in a tab separated file\n" for i in range(12)))
    r = kit.run_gate(tmp_path / "d.tsv", tmp_path / "tsv").report.as_dict()
    assert r["accepted"] and r["format"] == "tsv" and r["schema"] == "text"
    msgs = "messages\n" + "".join('"' + json.dumps(row["messages"]).replace('"', '""') + '"\n' for row in rows[:12])
    (tmp_path / "chat.csv").write_text(msgs)
    assert kit.run_gate(tmp_path / "chat.csv", tmp_path / "chatcsv").report.as_dict()["schema"] == "chat"

    jsonl = kit.write_jsonl(tmp_path / "inner.jsonl", rows)
    with zipfile.ZipFile(tmp_path / "d.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.write(jsonl, "data/train.jsonl")
        z.writestr("__MACOSX/._train.jsonl", b"junk")
    with tarfile.open(tmp_path / "d.tar.gz", "w:gz") as t:
        t.add(jsonl, "train.jsonl")
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(jsonl.read_bytes()))
    for name in ("d.zip", "d.tar.gz", "d.jsonl.gz"):
        r = kit.run_gate(tmp_path / name, tmp_path / name.replace(".", "-")).report.as_dict()
        assert r["accepted"] and r["format"] == "jsonl" and r["rows_kept"] == 20, (name, r["errors"])


def test_save_to_disk_dataset_and_datasetdict(tmp_path, kit):
    from datasets import Dataset, DatasetDict

    Dataset.from_list(kit.good_rows(15)).save_to_disk(tmp_path / "ds")
    r = kit.run_gate(tmp_path / "ds", tmp_path / "one").report.as_dict()
    assert r["accepted"] and r["format"] == "hf_disk" and r["rows_kept"] == 15
    train = kit.good_rows(30)
    validation = kit.good_rows(5, start=100) + [train[0]]  # one validation row leaks from train
    DatasetDict({"train": Dataset.from_list(train), "validation": Dataset.from_list(validation),
                 "test": Dataset.from_list(kit.good_rows(3, start=200))}).save_to_disk(tmp_path / "dd")
    result = kit.run_gate(tmp_path / "dd", tmp_path / "two")
    r = result.report.as_dict()
    assert r["accepted"] and r["train_rows"] == 30 and r["validation_rows"] == 6
    assert r["warning_counts"]["train_validation_overlap"] == 1 and r["warning_counts"]["ignored_splits"] == 1
    overlap = next(w for w in r["warnings"] if w["code"] == "train_validation_overlap")
    assert overlap["line"] == 36  # validation rows continue the numbering after the 30 train rows
    shutil.make_archive(str(tmp_path / "dd_archive"), "zip", tmp_path, "dd")
    r = kit.run_gate(tmp_path / "dd_archive.zip", tmp_path / "three").report.as_dict()
    assert r["accepted"] and r["format"] == "hf_disk" and r["train_rows"] == 30
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": 5}')
    assert "dataset_dict.json is not what `datasets` writes" in rejected_with(tmp_path / "four", kit, tmp_path / "dd",
                                                                             "unreadable_file")
    (tmp_path / "ds" / "state.json").write_text('{"_data_files": [{"filename": null}]}')
    assert "state.json" in rejected_with(tmp_path / "five", kit, tmp_path / "ds", "unreadable_file")


def test_hub_ids_without_a_reachable_hub_are_rejected_with_a_reason(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError) as exc:
        HubSource.open("org/some-dataset")
    assert exc.value.issue.code == "hub_unreachable"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    class RepositoryNotFoundError(Exception):
        pass

    def missing(self, *a, **kw):
        raise RepositoryNotFoundError("404")
    monkeypatch.setattr("huggingface_hub.HfApi.dataset_info", missing)
    with pytest.raises(SourceError) as exc:
        HubSource.open("org/missing")
    assert exc.value.issue.code == "hub_error"


# ------------------------------------------------------------------ error catalogue


def test_row_errors_all_reported_with_line_numbers(tmp_path, kit):
    u = {"role": "user", "content": "q"}
    a = {"role": "assistant", "content": "a"}
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}
    bad_call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}},
                                                                      {"type": "function", "function": {}}]}
    bad = [
        b"\xef\xbb\xbf" + json.dumps(kit.chat_row(1000)).encode(),            # 1 BOM at the start: stripped
        b"\xef\xbb\xbf" + json.dumps(kit.chat_row(1001)).encode(),            # 2 bom (inside the file)
        b'{"messages": [{"role": "user", "content": "\xff"}]}',                   # 3 bad_encoding
        b'{"messages": [',                                                        # 4 invalid_json
        b"[1, 2, 3]",                                                             # 5 row_not_object
        {"foo": "bar"},                                                           # 6 unknown_schema
        {"mesages": [u, a]},                                                      # 7 unknown_key (did you mean)
        {"prompt": "p", "completion": "c"},                                       # 8 mixed_schema
        {"messages": "hi"},                                                       # 9 messages_not_list
        {"messages": [u, 5]},                                                     # 10 message_not_object
        {"messages": [{"role": "robot", "content": "x"}, u, a]},                  # 11 unknown_role
        {"messages": [u, {"role": "assistant", "content": ["x"]}]},               # 12 content_not_string
        {"messages": [u, {"role": "assistant", "content": ""}]},                  # 13 empty_content
        {"messages": [u]},                                                        # 14 no_assistant
        {"messages": [a, u, a]},                                                  # 15 role_order
        {"messages": [u, {**a, "weight": 0.5}]},                                  # 16 bad_weight
        {"messages": [u, {**a, "weight": 0}]},                                    # 17 nothing_to_train
        {"messages": [{"content": "x"}, a]},                                      # 18 missing_key (+role_order)
        b'{"messages": "' + b"x" * 3000 + b'"}',                                  # 19 line_too_long
        b'{"messages": [{"role": "user", "content": "q"}], "score": NaN}',        # 20 invalid_number
        b'{"messages": "a\x00b"}',                                                # 21 binary_content
        {"messages": [audio, a]},                                                 # 22 content_part_unsupported
        {"messages": [u, bad_call]},                                              # 23 bad_tool_call
        {"messages": [u, a], "id": 7, "source": "web"},                           # 24 fine: extra keys ignored
    ]
    path = kit.write_jsonl(tmp_path / "bad.jsonl", bad + kit.good_rows(12))
    r = kit.run_gate(path, tmp_path, settings=IngestSettings(max_line_bytes=2048)).report.as_dict()
    got = kit.errors(r)
    expected = [None, "bom", "bad_encoding", "invalid_json", "row_not_object", "unknown_schema", "unknown_key",
                "mixed_schema", "messages_not_list", "message_not_object", "unknown_role", "content_not_string",
                "empty_content", "no_assistant", "role_order", "bad_weight", "nothing_to_train", "missing_key",
                "line_too_long", "invalid_number", "binary_content", "content_part_unsupported", "bad_tool_call",
                None]
    for line, code in enumerate(expected, start=1):
        if code is None:
            assert line not in got, (line, got.get(line))
        else:
            assert code in got[line], (line, code, got.get(line))
    assert "did you mean `messages`" in next(e["message"] for e in r["errors"] if e["line"] == 7)
    assert not r["accepted"] and r["rows_total"] == len(bad) + 12 and r["rows_kept"] == 14
    assert r["warning_counts"]["bom_stripped"] == 1 and r["ignored_keys"] == {"id": 1, "source": 1}
    assert r["layout"] == "openai_chat" and r["layout_counts"] == {"openai_chat": 14}
    assert r["error_count"] >= len(expected)


def test_other_schema_and_file_level_errors(tmp_path, kit):
    rows = [{"prompt": "p", "completion": 5}, {"prompt": "p", "completion": ""}]
    got = kit.errors(kit.run_gate(kit.write_jsonl(tmp_path / "pc.jsonl", rows), tmp_path / "pc").report.as_dict())
    assert got[1] == ["field_not_string"] and got[2] == ["empty_field"] and "too_few_examples" in got[None]
    pref = [{"prompt": "q", "chosen": "same", "rejected": "same"}]
    assert kit.errors(kit.run_gate(kit.write_jsonl(tmp_path / "p.jsonl", pref), tmp_path / "p").report.as_dict())[1] == [
        "chosen_equals_rejected"]
    r = kit.run_gate(kit.write_jsonl(tmp_path / "dpo.jsonl", kit.good_rows(12)), tmp_path / "dpo",
                     request=GateRequest(purpose="dpo")).report.as_dict()
    assert kit.errors(r)[1] == ["schema_purpose_mismatch"] and not r["accepted"]
    r = kit.run_gate(kit.write_jsonl(tmp_path / "many.jsonl", kit.good_rows(30)), tmp_path / "many",
                     settings=IngestSettings(max_examples_by_tier={"free": 20}),
                     request=GateRequest(tier="free")).report.as_dict()
    assert "too_many_examples" in kit.errors(r)[None]
    r = kit.run_gate(kit.write_jsonl(tmp_path / "blank.jsonl", [b"", b" "]), tmp_path / "blank").report.as_dict()
    assert "empty_file" in kit.errors(r)[None]


def test_bad_uploads_are_rejected_never_crash(tmp_path, kit):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    rejected_with(tmp_path / "a", kit, tmp_path / "empty.jsonl", "empty_file")
    (tmp_path / "prog.jsonl").write_bytes(b"\x7fELF\x02\x01\x01\x00" + os.urandom(4096))
    rejected_with(tmp_path / "b", kit, tmp_path / "prog.jsonl", "binary_file")
    (tmp_path / "noise.bin").write_bytes(os.urandom(100))
    rejected_with(tmp_path / "c", kit, tmp_path / "noise.bin", "unsupported_format")
    (tmp_path / "evil.exe").write_bytes(b"MZ\x90\x00")
    assert ".exe" in rejected_with(tmp_path / "d", kit, tmp_path / "evil.exe", "unsupported_format")
    (tmp_path / "data.txt").write_text("just prose\n")
    rejected_with(tmp_path / "e", kit, tmp_path / "data.txt", "unsupported_format")
    (tmp_path / "arr.json").write_text(json.dumps(kit.good_rows(3)))
    rejected_with(tmp_path / "f", kit, tmp_path / "arr.json", "json_array")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(kit.good_rows(3)), tmp_path / "really_parquet.jsonl")
    rejected_with(tmp_path / "g", kit, tmp_path / "really_parquet.jsonl", "extension_mismatch")
    kit.write_jsonl(tmp_path / "really_text.parquet", kit.good_rows(3))
    rejected_with(tmp_path / "h", kit, tmp_path / "really_text.parquet", "extension_mismatch")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 10)
    rejected_with(tmp_path / "i", kit, tmp_path / "broken.parquet", "unreadable_file")
    assert check_name("../../etc/passwd").code == "unsafe_name"
    assert check_name("a/b.jsonl").code == "unsafe_name" and check_name("bad\x00name").code == "unsafe_name"
    assert check_name("fine name (v2).jsonl") is None


def test_zip_bombs_and_hostile_archives(tmp_path, kit):
    small = IngestSettings(max_unpacked_bytes=64 * 2**20, max_compression_ratio=50.0)
    with open(tmp_path / "zeros", "wb") as f:
        f.truncate(100 * 2**20)  # 100 MB of zeros, compresses to ~100 KB
    (tmp_path / "bomb.jsonl.gz").write_bytes(gzip.compress((tmp_path / "zeros").read_bytes(), 9))
    assert "expands more than" in rejected_with(tmp_path / "a", kit, tmp_path / "bomb.jsonl.gz", "archive_bomb",
                                                settings=small)
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.write(tmp_path / "zeros", "train.jsonl")
    rejected_with(tmp_path / "b", kit, tmp_path / "bomb.zip", "archive_bomb", settings=small)
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as z:
        for i in range(30):
            z.writestr(f"f{i}.jsonl", b"{}")
    rejected_with(tmp_path / "c", kit, tmp_path / "many.zip", "archive_bomb",
                  settings=IngestSettings(max_archive_members=20))
    with zipfile.ZipFile(tmp_path / "escape.zip", "w") as z:
        z.writestr("../../outside.jsonl", b"{}")
    rejected_with(tmp_path / "d", kit, tmp_path / "escape.zip", "archive_unsafe")
    assert not (tmp_path / "outside.jsonl").exists()
    with tarfile.open(tmp_path / "link.tar", "w") as t:
        info = tarfile.TarInfo("train.jsonl")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    rejected_with(tmp_path / "e", kit, tmp_path / "link.tar", "archive_unsafe")
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("train.jsonl", b"{}")
    with zipfile.ZipFile(tmp_path / "nested.zip", "w") as z:
        z.writestr("inner.zip", inner.getvalue())
    rejected_with(tmp_path / "f", kit, tmp_path / "nested.zip", "archive_unsafe")
    with zipfile.ZipFile(tmp_path / "two.zip", "w") as z:
        z.writestr("a.jsonl", b"{}")
        z.writestr("b.jsonl", b"{}")
    rejected_with(tmp_path / "g", kit, tmp_path / "two.zip", "archive_invalid")
    (tmp_path / "trunc.zip").write_bytes((tmp_path / "two.zip").read_bytes()[:40])
    rejected_with(tmp_path / "h", kit, tmp_path / "trunc.zip", "archive_invalid")


def test_a_100mb_single_line_is_skipped_in_bounded_memory(tmp_path, kit):
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        for row in kit.good_rows(6):
            f.write(json.dumps(row).encode() + b"\n")
        f.write(b'{"messages": "' + b"A" * (100 * 2**20) + b'"}\n')
        for row in kit.good_rows(6, start=6):
            f.write(json.dumps(row).encode() + b"\n")
    r = kit.run_gate(path, tmp_path).report.as_dict()
    assert kit.errors(r) == {7: ["line_too_long"]} and r["rows_kept"] == 12 and r["rows_total"] == 13


