"""Training files exactly as users' tools write them (generated here, not downloaded): OpenAI chat with
content parts and tool calls, ShareGPT (Axolotl / LLaMA-Factory), Alpaca, TRL preference, UltraFeedback,
OpenAI DPO, pandas and Excel CSVs, macOS archives. Each: the verdict, the normalised rows, the loss mask."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import time
import zipfile

import pytest

from whetstone.ingest.adapters.archives import MAX_HEADER_BYTES, SourceError
from whetstone.ingest.entrypoints.cli import check_main
from whetstone.ingest.usecases.gates import GateRequest

pytestmark = pytest.mark.integration

IGNORE = -100
# a ChatML-like template WITH tool support (tools in a system block, calls as JSON, results as tool turns)
TOOL_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools -%}{{- '<|system|>\\nTools: ' + (tools | tojson) + '<|end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|user|>\\n<result>' + message['content'] + '</result><|end|>\\n' -}}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|assistant|>\\n' + message['content'] -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{{- '<call>' + call['function']['name'] + ' ' + (call['function']['arguments'] | tojson) + '</call>' -}}"
    "{%- endfor -%}{{- '<|end|>\\n' -}}"
    "{%- else -%}{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tiny_tok(ingest_tiny_model):
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer

    return BaseModelTokenizer.load(str(ingest_tiny_model))


@pytest.fixture(scope="module")
def tool_tok(ingest_tiny_model, tmp_path_factory):
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer

    model = tmp_path_factory.mktemp("tools") / "tiny-tools"
    shutil.copytree(ingest_tiny_model, model)
    (model / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return BaseModelTokenizer.load(str(model))


def tokenized(result) -> dict[int, dict]:
    return {row["line"]: row for p in result.tokenized_paths.values()
            for row in map(json.loads, p.read_text().splitlines())}


def trained_text(tok, record: dict, prefix: str = "") -> str:
    return tok.tok.decode([x for x in record[prefix + "labels"] if x != IGNORE])


def rows_out(result) -> list[dict]:
    return [json.loads(line) for p in (result.train_path, result.validation_path) if p
            for line in p.read_text().splitlines()]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


# ---------------------------------------------------------------------------- OpenAI chat


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                                 "parameters": {"type": "object", "properties": {
                                                     "city": {"type": "string"}}, "required": ["city"]}}}


def openai_tool_row(i: int) -> dict:
    """OpenAI's fine-tuning docs' function-calling example, as their client writes it."""
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": f"City{i}"})}}
    return {"messages": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": [{"type": "text", "text": f"Weather in City{i}?"},
                                     {"type": "text", "text": "Be brief."}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"RESULT{i} sunny"},
        {"role": "assistant", "content": f"Sunny in City{i}.", "weight": 1, "name": "weatherbot"},
    ], "tools": [WEATHER_TOOL], "parallel_tool_calls": False}


def test_openai_chat_with_parts_and_tools_is_rendered_with_the_templates_tool_support(tmp_path, kit, tool_tok,
                                                                                      tiny_tok):
    rows = [openai_tool_row(i) for i in range(12)]
    path = kit.write_jsonl(tmp_path / "tools.jsonl", rows)
    result = kit.run_gate(path, tmp_path / "ok", tokenizer=tool_tok)
    r = result.report.as_dict()
    assert r["accepted"], r["errors"]
    assert r["layout"] == "openai_chat" and r["layout_counts"] == {"openai_chat": 12} and r["ignored_keys"] == {}
    out = next(o for o in rows_out(result) if "City0" in json.dumps(o))
    assert out["tools"] == [WEATHER_TOOL]
    assert out["messages"][1] == {"role": "user", "content": "Weather in City0?\nBe brief."}    # parts joined
    assert out["messages"][2] == {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "City0"}'}}]}
    assert out["messages"][3] == {"role": "tool", "content": "RESULT0 sunny", "tool_call_id": "call_0"}
    assert out["messages"][4]["name"] == "weatherbot"
    trained = trained_text(tool_tok, tokenized(result)[1])
    # the call and the answer are trained; the tool result, the user turn, the tool definitions are not
    assert "get_weather" in trained and "City0" in trained and "Sunny in City0." in trained
    assert "RESULT0" not in trained and "Weather in" not in trained and "Current weather" not in trained
    assert r["stats"]["roles"]["tool"] == 12

    refused = kit.run_gate(path, tmp_path / "no-tools", tokenizer=tiny_tok).report.as_dict()
    assert not refused["accepted"] and refused["error_counts"] == {"too_few_examples": 1, "tools_unsupported": 12}
    first = refused["errors"][0]
    assert first["code"] == "tools_unsupported" and first["line"] == 1 and "template" in first["message"]

    unchecked = kit.run_gate(path, tmp_path / "no-model").report.as_dict()
    assert unchecked["accepted"] and unchecked["warning_counts"]["tools_unchecked"] == 1


def test_a_different_tool_call_is_not_an_exact_duplicate(tmp_path, kit):
    rows = [openai_tool_row(i) for i in range(12)]
    twin = json.loads(json.dumps(rows[0]))
    twin["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"city": "Elsewhere"}'
    r = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", rows + [twin, rows[1]]), tmp_path).report.as_dict()
    assert r["exact_duplicates"] == 1 and r["exact_duplicate_lines"] == [14]


# ------------------------------------------------------------------------------- ShareGPT


def test_sharegpt_as_axolotl_and_llama_factory_write_it(tmp_path, kit, tiny_tok):
    axolotl = [{"conversations": [{"from": "system", "value": "Be kind."},
                                  {"from": "human", "value": f"Hello number {i}"},
                                  {"from": "gpt", "value": f"Hi there {i}!"}], "id": f"a{i}"} for i in range(8)]
    factory = [{"conversations": [{"role": "user", "content": f"Question {i}"},
                                  {"role": "assistant", "content": f"Answer {i}"}], "system": "Be brief."}
               for i in range(6)]
    result = kit.run_gate(kit.write_jsonl(tmp_path / "share.jsonl", axolotl + factory), tmp_path / "g",
                          tokenizer=tiny_tok)
    r = result.report.as_dict()
    assert r["accepted"], r["errors"]
    assert r["layout"] == "sharegpt" and r["schema"] == "chat" and r["layout_counts"] == {"sharegpt": 14}
    assert r["role_mapping"]["sharegpt"] == {"system": "system", "human": "user", "gpt": "assistant",
                                             "user": "user", "assistant": "assistant"}
    assert r["ignored_keys"] == {"id": 8} and r["warning_counts"]["ignored_keys"] == 1
    out = {json.dumps(o) for o in rows_out(result)}
    assert json.dumps({"messages": [{"role": "system", "content": "Be kind."}, user("Hello number 0"),
                                    assistant("Hi there 0!")]}) in out
    assert json.dumps({"messages": [{"role": "system", "content": "Be brief."}, user("Question 3"),
                                    assistant("Answer 3")]}) in out
    masks = tokenized(result)
    assert trained_text(tiny_tok, masks[1]) == "Hi there 0!<|end|>"
    assert trained_text(tiny_tok, masks[12]) == "Answer 3<|end|>"


# --------------------------------------------------------------------------- Alpaca


def test_alpaca_with_and_without_input(tmp_path, kit, tiny_tok):
    rows = [{"instruction": f"Translate item {i}", "input": f"text {i}" if i % 2 else "", "output": f"texte {i}"}
            for i in range(10)]
    rows += [{"instruction": "Continue", "input": "", "output": "Done.", "system": "Be terse.",
              "history": [["First?", "Yes."]]}]
    result = kit.run_gate(kit.write_jsonl(tmp_path / "alpaca.jsonl", rows), tmp_path / "g", tokenizer=tiny_tok)
    r = result.report.as_dict()
    assert r["accepted"] and r["layout"] == "alpaca" and r["schema"] == "instruction"
    assert r["role_mapping"]["alpaca"]["output"] == "assistant"
    out = {json.dumps(o) for o in rows_out(result)}
    assert json.dumps({"messages": [user("Translate item 1\n\ntext 1"), assistant("texte 1")]}) in out
    assert json.dumps({"messages": [user("Translate item 0"), assistant("texte 0")]}) in out
    masks = tokenized(result)
    assert trained_text(tiny_tok, masks[2]) == "texte 1<|end|>"
    assert trained_text(tiny_tok, masks[11]) == "Yes.<|end|>Done.<|end|>"     # history answers are trained too


# -------------------------------------------------------------------------- preference


def test_trl_preference_with_and_without_prompt_and_openai_dpo(tmp_path, kit, tiny_tok):
    explicit = [{"prompt": [user(f"Pick {i}")], "chosen": [assistant(f"good {i}")],
                 "rejected": [assistant(f"bad {i}")]} for i in range(6)]
    implicit = [{"chosen": [user(f"Choose {i}"), assistant(f"fine {i}")],
                 "rejected": [user(f"Choose {i}"), assistant(f"poor {i}")]} for i in range(6)]
    result = kit.run_gate(kit.write_jsonl(tmp_path / "trl.jsonl", explicit + implicit), tmp_path / "trl",
                          tokenizer=tiny_tok)
    r = result.report.as_dict()
    assert r["accepted"] and r["layout"] == "trl_preference" and r["purpose"] == "dpo"
    out = {json.dumps(o) for o in rows_out(result)}
    assert json.dumps({"prompt": [user("Choose 2")], "chosen": [assistant("fine 2")],
                       "rejected": [assistant("poor 2")]}) in out
    mask = tokenized(result)[1]
    assert trained_text(tiny_tok, mask, "chosen_") == "good 0<|end|>"
    assert trained_text(tiny_tok, mask, "rejected_") == "bad 0<|end|>"

    dpo = [{"input": {"messages": [user(f"Hello {i}")], "tools": [], "parallel_tool_calls": True},
            "preferred_output": [assistant(f"Hi, friend {i}.")], "non_preferred_output": [assistant(f"Go away {i}.")]}
           for i in range(12)]
    result = kit.run_gate(kit.write_jsonl(tmp_path / "dpo.jsonl", dpo), tmp_path / "dpo", tokenizer=tiny_tok,
                          request=GateRequest(purpose="dpo"))
    r = result.report.as_dict()
    assert r["accepted"], r["errors"]
    assert r["layout"] == "openai_dpo" and r["schema"] == "preference"
    assert r["role_mapping"]["openai_dpo"]["preferred_output"] == "chosen"
    assert json.dumps({"prompt": [user("Hello 4")], "chosen": [assistant("Hi, friend 4.")],
                       "rejected": [assistant("Go away 4.")]}) in {json.dumps(o) for o in rows_out(result)}
    assert trained_text(tiny_tok, tokenized(result)[5], "rejected_") == "Go away 4.<|end|>"


def test_ultrafeedback_rows_follow_the_purpose(tmp_path, kit):
    rows = [{"prompt": f"Explain {i}", "prompt_id": f"id{i}",
             "chosen": [user(f"Explain {i}"), assistant(f"Clear answer {i}.")],
             "rejected": [user(f"Explain {i}"), assistant(f"Muddled {i}.")],
             "messages": [user(f"Explain {i}"), assistant(f"Clear answer {i}.")],
             "score_chosen": 9.0, "score_rejected": 3.5} for i in range(12)]
    path = kit.write_jsonl(tmp_path / "uf.jsonl", rows)
    dpo = kit.run_gate(path, tmp_path / "dpo", request=GateRequest(purpose="dpo"))
    r = dpo.report.as_dict()
    assert r["accepted"] and r["layout"] == "trl_preference"
    assert r["ignored_keys"] == {"prompt_id": 12, "messages": 12, "score_chosen": 12, "score_rejected": 12}
    assert {"prompt": [user("Explain 0")], "chosen": [assistant("Clear answer 0.")],
            "rejected": [assistant("Muddled 0.")]} in rows_out(dpo)
    sft = kit.run_gate(path, tmp_path / "sft", request=GateRequest(purpose="sft")).report.as_dict()
    assert sft["accepted"] and sft["layout"] == "openai_chat" and "ambiguous_layout" not in sft["warning_counts"]
    default = kit.run_gate(path, tmp_path / "default").report.as_dict()
    assert default["layout"] == "openai_chat" and default["warning_counts"]["ambiguous_layout"] == 1


# ----------------------------------------------------------------------- spreadsheets


def test_csv_and_tsv_as_pandas_and_excel_write_them(tmp_path, kit):
    import pandas as pd

    frame = pd.DataFrame({"prompt": [f"Line {i}, with a comma\nand a newline" for i in range(12)],
                          "completion": [f'Answer "{i}"; done' for i in range(12)]})
    frame.to_csv(tmp_path / "pandas.csv")                                      # leading unnamed index column
    r = kit.run_gate(tmp_path / "pandas.csv", tmp_path / "a").report.as_dict()
    assert r["accepted"] and r["format"] == "csv" and r["layout"] == "prompt_completion", r["errors"]
    assert r["ignored_keys"] == {}
    frame.to_csv(tmp_path / "excel.csv", sep=";", index=False, encoding="utf-8-sig")  # Excel "CSV UTF-8", semicolons
    assert (tmp_path / "excel.csv").read_bytes().startswith(b"\xef\xbb\xbf")
    r = kit.run_gate(tmp_path / "excel.csv", tmp_path / "b").report.as_dict()
    assert r["accepted"] and r["rows_kept"] == 12 and r["errors"] == [], r["errors"]
    frame.to_csv(tmp_path / "tabs.tsv", sep="\t", index=False)
    r = kit.run_gate(tmp_path / "tabs.tsv", tmp_path / "c").report.as_dict()
    assert r["accepted"] and r["format"] == "tsv"
    (tmp_path / "wrong.csv").write_text("question|answer\n" + "".join(f"q{i}|a{i}\n" for i in range(12)))
    r = kit.run_gate(tmp_path / "wrong.csv", tmp_path / "d").report.as_dict()
    assert not r["accepted"] and "delimiter ','" in r["errors"][0]["message"]   # names the dialect it tried
    (tmp_path / "nul.csv").write_text("text\n" + "".join(f"row {i}\n" for i in range(12)) + "bad\x00row\n")
    r = kit.run_gate(tmp_path / "nul.csv", tmp_path / "e").report.as_dict()
    assert r["errors"][0]["code"] == "binary_content" and r["errors"][0]["line"] == 14


def test_a_nul_near_the_start_of_a_jsonl_names_its_line(tmp_path, kit):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "bro\x00ken"}\n' + b"".join(
        json.dumps({"text": f"document {i}"}).encode() + b"\n" for i in range(12)))
    r = kit.run_gate(path, tmp_path / "g").report.as_dict()
    assert r["errors"][0]["code"] == "binary_content" and r["errors"][0]["line"] == 2 and r["rows_kept"] == 13


# ------------------------------------------------------------------------------- archives


def test_macos_metadata_is_ignored_in_archives(tmp_path, kit):
    data = kit.write_jsonl(tmp_path / "train.jsonl", kit.good_rows(15)).read_bytes()
    tar_path = tmp_path / "mac.tar.gz"
    with tarfile.open(tar_path, "w:gz") as t:                                  # what macOS `tar` / Finder write
        for name, body in (("data/train.jsonl", data), ("data/._train.jsonl", b"\x00\x05\x16\x07AppleDouble"),
                           ("data/.DS_Store", b"\x00\x00\x00\x01Bud1"), ("__MACOSX/data/._x", b"junk")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    zip_path = tmp_path / "mac.zip"
    with zipfile.ZipFile(zip_path, "w") as z:
        z.writestr("data/train.jsonl", data)
        z.writestr("__MACOSX/data/._train.jsonl", b"junk")
        z.writestr("data/.DS_Store", b"junk")
    for archive in (tar_path, zip_path):
        r = kit.run_gate(archive, tmp_path / archive.name.replace(".", "-")).report.as_dict()
        assert r["accepted"] and r["rows_kept"] == 15, (archive.name, r["errors"])


def test_a_huge_tar_long_name_header_is_refused_before_it_is_read(tmp_path, kit):
    import resource

    path = tmp_path / "longname.tar.gz"
    declared = 512 * 2**20                                                     # a 512 MB "file name"
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, declared
    with open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as t:
        t.fileobj.write(header.tobuf(format=tarfile.GNU_FORMAT)[:512])
        t.fileobj.write(b"a" * (4 * 2**20))                                    # the start of the "name" only
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(SourceError) as exc:
        kit.run_gate(path, tmp_path / "g")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert exc.value.issue.code == "archive_invalid" and str(MAX_HEADER_BYTES) in exc.value.issue.message
    assert grown_mb < 100 and time.perf_counter() - started < 10


# ---------------------------------------------------------------------------- the CLI


def test_cli_json_reports_layout_and_ignored_keys(tmp_path, kit, capsys):
    rows = [{"conversations": [{"from": "human", "value": f"hi {i}"}, {"from": "gpt", "value": f"hello {i}"}],
             "source": "web", "meta": {"n": i}} for i in range(12)]
    path = kit.write_jsonl(tmp_path / "share.jsonl", rows)
    assert check_main([str(path), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layout"] == "sharegpt" and report["ignored_keys"] == {"source": 12, "meta": 12}
    assert report["status"] == "accepted" and report["rows_kept"] == 12
    assert "source (12 rows)" in next(w["message"] for w in report["warnings"] if w["code"] == "ignored_keys")
    typo = kit.write_jsonl(tmp_path / "typo.jsonl", [{"mesages": [user("q"), assistant("a")]}] * 12)
    assert check_main([str(typo), "--json", "--quiet"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["errors"][0] == {"code": "unknown_key", "line": 1, "field": "mesages",
                                   "message": "unknown key `mesages`; did you mean `messages`?"}
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + kit.write_jsonl(tmp_path / "plain.jsonl", kit.good_rows(12)).read_bytes())
    assert check_main([str(bom), "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["warning_counts"]["bom_stripped"] == 1
