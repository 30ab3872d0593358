"""The data gate on real files (no stack): dedup, contamination, PII, toxicity, tokenization
with the base model's tokenizer, the CLI and reinforcement rows."""

from __future__ import annotations

import json
import shutil

import pytest

from whetstone.ingest.entrypoints.cli import check_main
from whetstone.ingest.config import IngestSettings
from whetstone.ingest.domain.policies import PolicyOverrides
from whetstone.ingest.usecases.gates import GateRequest

pytestmark = pytest.mark.integration


# --------------------------------------------------------------- dedup & screening


def test_exact_and_near_duplicates_with_clusters(tmp_path, kit):
    long = " ".join(f"word{i} alpha beta gamma delta" for i in range(60))
    rows = kit.good_rows(20)
    rows.append(kit.chat_row(100, long))                                        # line 21, kept
    rows.append({"messages": [{"role": "user", "content": "QUESTION NUMBER 3:  what is 3 plus 3?"},
                              {"role": "assistant", "content": "The answer to question 3 is 6."}]})  # 22 exact dup
    rows.append(kit.chat_row(100, long.replace("word7 ", "wordX ")))            # 23 near dup of 21
    rows.append(kit.chat_row(100, long.replace("word9 ", "wordY ")))            # 24 near dup of 21
    rows.append(kit.chat_row(100, " ".join(long.split()[:150]) + " totally different ending" * 20))  # 25: not
    result = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", rows), tmp_path)
    r = result.report.as_dict()
    assert r["exact_duplicates"] == 1 and r["exact_duplicate_lines"] == [22]
    assert r["near_duplicates"] == 2 and r["rows_kept"] == 22
    cluster = r["near_dup"]["clusters"][0]
    assert cluster["kept_line"] == 21 and sorted(cluster["duplicate_lines"]) == [23, 24]
    assert cluster["max_jaccard"] >= 0.9
    audit = kit.read_jsonl(result.audit_path)
    near = {a["line"]: a for a in audit if a["reason"] == "near_duplicate"}
    assert set(near) == {23, 24} and all(a["jaccard"] >= 0.9 and a["duplicate_of"] in (21, 23, 24)
                                         for a in near.values())
    flagged = kit.run_gate(tmp_path / "d.jsonl", tmp_path / "flag", request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({"near_dup": "flag"}))).report.as_dict()
    assert flagged["near_duplicates"] == 2 and flagged["rows_kept"] == 24
    strict = kit.run_gate(tmp_path / "d.jsonl", tmp_path / "strict", request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({"near_dup_threshold": 0.999}))).report.as_dict()
    assert strict["near_duplicates"] == 0


def test_contamination_flag_and_remove(tmp_path, kit):
    bench = ("Which of the following best describes the primary function of the mitochondria in eukaryotic "
             "cells and how does it relate to cellular respiration")
    refs = tmp_path / "refs"
    refs.mkdir()
    kit.write_jsonl(refs / "mini-mmlu.jsonl", [{"question": bench, "choices": ["A", "B"], "answer": "A"}])
    rows = kit.good_rows(20) + [
        {"messages": [{"role": "user", "content": bench + "?"}, {"role": "assistant", "content": "A"}]},
        {"messages": [{"role": "user", "content": bench}, {"role": "assistant", "content": " ".join(
            f"original{i}" for i in range(40))}]},
    ]
    path = kit.write_jsonl(tmp_path / "d.jsonl", rows)
    result = kit.run_gate(path, tmp_path / "flag", references=[refs])
    r = result.report.as_dict()
    assert r["contaminated"] == 1 and r["accepted"] and r["rows_kept"] == 22
    assert r["contamination"]["examples"] == [{"line": 21, "fraction": pytest.approx(1.0, abs=0.2),
                                               "reference": "mini-mmlu"}]
    assert r["contamination"]["references"] == {"mini-mmlu": {"items": 1, "ngrams": 14}}
    removed = kit.run_gate(path, tmp_path / "remove", references=[refs], request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({"contamination": "remove"}))).report.as_dict()
    assert removed["contaminated"] == 1 and removed["rows_kept"] == 21


def test_pii_warn_redact_block(tmp_path, kit):
    rows = kit.good_rows(12) + [kit.chat_row(50, "Mail jane@corp.example or card 4111 1111 1111 1111.")]
    path = kit.write_jsonl(tmp_path / "d.jsonl", rows)
    warn = kit.run_gate(path, tmp_path / "w")
    warned = warn.report.as_dict()
    assert warned["pii_hits"] == 2 and warned["pii"]["by_kind"] == {"credit_card": 1, "email": 1}
    assert warn.report.as_dict()["accepted"] and "jane@corp.example" in (warn.train_path.read_text() + (
        warn.validation_path.read_text() if warn.validation_path else ""))
    redact = kit.run_gate(path, tmp_path / "r", request=GateRequest(policy_overrides=PolicyOverrides.model_validate({"pii": "redact"})))
    text = redact.train_path.read_text() + (redact.validation_path.read_text() if redact.validation_path else "")
    assert "[EMAIL]" in text and "[CREDIT_CARD]" in text and "jane@" not in text
    assert "jane" not in json.dumps(redact.report.as_dict())  # the report never repeats the personal data
    block = kit.run_gate(path, tmp_path / "b", request=GateRequest(policy_overrides=PolicyOverrides.model_validate({"pii": "block"}))).report.as_dict()
    assert kit.errors(block) == {13: ["pii_blocked"]} and not block["accepted"]


def test_toxicity_flag_remove_block(tmp_path, kit):
    rows = kit.good_rows(12) + [kit.chat_row(60, "Shut up, you stupid bitch.")]
    path = kit.write_jsonl(tmp_path / "d.jsonl", rows)
    flag = kit.run_gate(path, tmp_path / "f").report.as_dict()
    assert flag["toxic"] == 1 and flag["rows_kept"] == 13 and flag["warning_counts"]["toxicity"] == 1
    assert kit.run_gate(path, tmp_path / "r", request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({"toxicity": "remove"}))).report.as_dict()["rows_kept"] == 12
    block = kit.run_gate(path, tmp_path / "b", request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({"toxicity": "block"}))).report.as_dict()
    assert kit.errors(block) == {13: ["toxic_blocked"]}
    off = kit.run_gate(path, tmp_path / "o", request=GateRequest(policy_overrides=PolicyOverrides.model_validate({"toxicity": "off"}))).report.as_dict()
    assert off["toxic"] == 0


# -------------------------------------------------------------------- tokenization


def test_tokenization_with_the_base_models_template(tmp_path, kit, ingest_tiny_model):
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer
    from whetstone.modelkit.chat import tokenize_chat
    from whetstone.modelkit.loading import load_tokenizer

    tok = BaseModelTokenizer.load(str(ingest_tiny_model))
    rows = kit.good_rows(12)
    rows.append({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello", "weight": 0},
                              {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hello again"}]})
    path = kit.write_jsonl(tmp_path / "d.jsonl", rows)
    result = kit.run_gate(path, tmp_path / "t", tokenizer=tok)
    r = result.report.as_dict()
    reference = load_tokenizer(ingest_tiny_model)
    expected = sum(len(tokenize_chat(reference, row["messages"])["input_ids"]) for row in rows)
    assert r["accepted"] and r["tokens_total"] == expected and not r["tokens_estimated"]
    assert r["tokenization"]["tokenizer_hash"] == tok.hash and len(tok.hash) == 64
    previews = r["tokenization"]["mask_preview"]
    assert len(previews) == 3 and "[[" in previews[0]["rendered"] and "<|assistant|>\n[[" in previews[0]["rendered"]
    tokenized = [json.loads(line) for side in result.tokenized_paths.values() for line in side.read_text().splitlines()]
    assert len(tokenized) == 13 and all(len(t["input_ids"]) == len(t["labels"]) for t in tokenized)
    weighted = next(t for t in tokenized if t["line"] == 13)
    assert weighted["labels"] == tokenize_chat(reference, rows[12]["messages"])["labels"]  # weight 0: not trained
    assert r["stats"]["trained_tokens"] == sum(sum(1 for x in t["labels"] if x != -100) for t in tokenized)
    assert r["cost_estimate"]["params_source"] == "safetensors" and not r["cost_estimate"]["tokens_estimated"]

    longest = max(len(t["input_ids"]) for t in tokenized)
    limit = {"max_seq_len": longest - 1}
    trunc = kit.run_gate(path, tmp_path / "tr", tokenizer=tok, request=GateRequest(policy_overrides=PolicyOverrides.model_validate(limit)))
    assert trunc.report.as_dict()["tokenization"]["truncated"] >= 1 and trunc.report.as_dict()["accepted"]
    assert max(len(json.loads(line)["input_ids"]) for p in trunc.tokenized_paths.values()
               for line in p.read_text().splitlines()) == longest - 1
    drop = kit.run_gate(path, tmp_path / "dr", tokenizer=tok, request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({**limit, "over_length": "drop"}))).report.as_dict()
    assert drop["rows_kept"] == 13 - drop["tokenization"]["dropped"] and drop["warning_counts"]["over_length_dropped"]
    reject = kit.run_gate(path, tmp_path / "rj", tokenizer=tok, request=GateRequest(
        policy_overrides=PolicyOverrides.model_validate({**limit, "over_length": "reject"}))).report.as_dict()
    assert not reject["accepted"] and "too_long" in reject["error_counts"]


def test_token_counts_of_an_earlier_run_are_reused_only_when_they_apply(tmp_path, kit, ingest_tiny_model):
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer
    from whetstone.ingest.usecases.pipeline import TokenCounts

    class Counting(BaseModelTokenizer):
        calls = 0

        def tokenize(self, out, max_len=None):
            Counting.calls += 1
            return super().tokenize(out, max_len)

    tok = Counting.load(str(ingest_tiny_model))
    path = kit.write_jsonl(tmp_path / "d.jsonl", kit.good_rows(30) + [kit.good_rows(1)[0]])
    first = kit.run_gate(path, tmp_path / "first", tokenizer=tok)
    fp = first.report.as_dict()["tokenization"]["fingerprint"]
    assert first.report.as_dict()["tokenization"]["cache"] is None and first.lengths_path.read_text().count("\n") == 30

    def again(where: str, **policies):
        from whetstone.ingest.usecases.gates import make_gate
        from whetstone.ingest.adapters.formats import open_source

        s = IngestSettings()
        Counting.calls = 0
        gate = make_gate(s, GateRequest(policy_overrides=PolicyOverrides.model_validate(policies)), tokenizer=tok, references=None, toxicity=None,
                         token_counts=TokenCounts.read(first.lengths_path, fp))
        return gate.run(open_source(path, workdir=tmp_path / where / "s"), tmp_path / where / "g")

    reused = again("reused")
    assert reused.report.as_dict()["tokenization"]["cache"] == "reused" and Counting.calls == 0
    assert reused.report.tokens_total == first.report.tokens_total and reused.tokenized_paths == {}
    assert reused.report.stats == first.report.stats and len(reused.report.tokenization.mask_preview) == 3
    stale = again("stale", max_seq_len=20)
    assert stale.report.as_dict()["tokenization"]["cache"] == "stale" and Counting.calls >= 30 and stale.tokenized_paths


def test_preference_and_text_tokenization(tmp_path, kit, ingest_tiny_model):
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer

    tok = BaseModelTokenizer.load(str(ingest_tiny_model))
    pref = [{"prompt": f"q{i}", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(12)]
    result = kit.run_gate(kit.write_jsonl(tmp_path / "p.jsonl", pref), tmp_path / "p", tokenizer=tok)
    t = json.loads(next(iter(result.tokenized_paths.values())).read_text().splitlines()[0])
    assert set(t) == {"line", "chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"}
    assert result.report.as_dict()["tokens_total"] > 0 and result.report.as_dict()["accepted"]
    text = [{"text": f"document {i} about rivers and mountains"} for i in range(12)]
    result = kit.run_gate(kit.write_jsonl(tmp_path / "t.jsonl", text), tmp_path / "t", tokenizer=tok)
    t = json.loads(next(iter(result.tokenized_paths.values())).read_text().splitlines()[0])
    assert t["labels"] == t["input_ids"] and t["input_ids"][-1] == tok.tok.eos_token_id


def test_a_template_that_cannot_render_a_row_is_a_row_error(tmp_path, kit, ingest_tiny_model):
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer

    model = tmp_path / "picky"
    shutil.copytree(ingest_tiny_model, model)
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(
        "{%- if messages[0]['role'] == 'system' -%}{{- raise_exception('no system prompts') -}}{%- endif -%}"
        + template)
    tok = BaseModelTokenizer.load(str(model))
    rows = kit.good_rows(12) + [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                              {"role": "assistant", "content": "a"}]}]
    r = kit.run_gate(kit.write_jsonl(tmp_path / "d.jsonl", rows), tmp_path / "g", tokenizer=tok).report.as_dict()
    assert kit.errors(r) == {13: ["template_error"]} and "no system prompts" in r["errors"][0]["message"]


# ----------------------------------------------------------------------------- CLI


def test_cli_json_report_and_exit_codes(tmp_path, kit, capsys, ingest_tiny_model):
    good = kit.write_jsonl(tmp_path / "good.jsonl", kit.good_rows(20))
    assert check_main([str(good), "--json", "--base-model", str(ingest_tiny_model)]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("accepted", "format", "schema", "errors", "warnings", "rows_total", "rows_kept", "exact_duplicates",
                "near_duplicates", "contaminated", "pii_hits", "tokens_total"):
        assert key in report
    assert report["accepted"] and report["tokens_total"] > 0 and not report["tokens_estimated"]

    bad = kit.write_jsonl(tmp_path / "bad.jsonl", kit.good_rows(12) + [b"{oops"])
    assert check_main([str(bad), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == [{"code": "invalid_json", "line": 13, "field": None,
                                 "message": report["errors"][0]["message"]}]
    assert check_main([str(bad)]) == 1
    assert "line 13: [invalid_json]" in capsys.readouterr().out
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert check_main([str(tmp_path / "empty.jsonl"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["errors"][0]["code"] == "empty_file"

    assert check_main([str(tmp_path / "missing.jsonl")]) == 2
    assert check_main([str(good), "--purpose", "bogus"]) == 2
    assert check_main([str(good), "--base-model", str(tmp_path / "no-model")]) == 2
    assert check_main([str(good), "--reference", str(tmp_path / "nope")]) == 2
    assert check_main([str(good), "--near-dup-threshold", "7"]) == 2
    capsys.readouterr()

    out = tmp_path / "clean"
    assert check_main([str(good), "--purpose", "eval", "--output-dir", str(out), "--json", "--quiet"]) == 0
    assert len((out / "validation.jsonl").read_text().splitlines()) == 20
    capsys.readouterr()
    val = kit.write_jsonl(tmp_path / "val.jsonl", kit.good_rows(4, start=500) + [kit.good_rows(1)[0]])
    assert check_main([str(good), "--validation-file", str(val), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["validation_rows"] == 5 and report["warning_counts"]["train_validation_overlap"] == 1


def test_progress_is_reported_while_streaming(tmp_path, kit):
    from whetstone.ingest.adapters.formats import open_source
    from whetstone.ingest.usecases.gates import make_gate

    path = kit.write_jsonl(tmp_path / "d.jsonl", kit.good_rows(3000))
    seen = []
    s = IngestSettings(batch_size=256)
    gate = make_gate(s, GateRequest(), tokenizer=None, references=None, toxicity=None,
                     progress=lambda phase, done, total: seen.append((phase, done, total)))
    gate.run(open_source(path, workdir=tmp_path / "s"), tmp_path / "g")
    validate = [(d, t) for p, d, t in seen if p == "validate"]
    assert len(validate) > 5 and validate[-1] == (path.stat().st_size, path.stat().st_size)
    assert all(a[0] <= b[0] for a, b in zip(validate, validate[1:]))
    assert any(p == "write" for p, _, _ in seen)


def rft_row(i: int, **extra) -> dict:
    return {"messages": [{"role": "developer", "content": "Answer with a number."},
                         {"role": "user", "content": f"What is {i} + {i}?"}],
            "answer": str(2 * i), "meta": {"source": "gen", "n": i}, **extra}


def test_rft_rows_are_accepted_with_their_item_and_broken_ones_name_the_line(tmp_path, kit, ingest_tiny_model):
    """OpenAI's reinforcement fine-tuning rows: messages ending with a user turn, the other keys the item."""
    from whetstone.ingest.adapters.files import sniff_purpose
    from whetstone.ingest.adapters.tokenizer import BaseModelTokenizer

    tok = BaseModelTokenizer.load(str(ingest_tiny_model))
    path = kit.write_jsonl(tmp_path / "rft.jsonl", [rft_row(i) for i in range(20)])
    assert sniff_purpose(path) == "rft"       # what an upload with OpenAI's purpose "fine-tune" becomes
    for purpose in (None, "rft"):
        result = kit.run_gate(path, tmp_path / str(purpose), tokenizer=tok, request=GateRequest(purpose=purpose))
        r = result.report.as_dict()
        assert r["accepted"], r["errors"]
        assert r["schema"] == "rft" and r["purpose"] == "rft" and r["layout"] == "openai_rft", r
        assert r["rows_kept"] == 20 and r["ignored_keys"] == {} and r["tokens_total"] > 0
        out = [o for p in (result.train_path, result.validation_path) if p for o in kit.read_jsonl(p)]
        assert len(out) == 20 and all(o["messages"][-1]["role"] == "user" for o in out)
        by_answer = {o["answer"]: o for o in out}
        assert by_answer["14"]["meta"] == {"source": "gen", "n": 7}           # the item kept as written
        assert by_answer["14"]["messages"][0]["role"] == "system"             # developer read as system

    a = {"role": "assistant", "content": "4"}
    bad = [rft_row(i) for i in range(12)] + [
        {**rft_row(100), "messages": [*rft_row(100)["messages"], a]},     # 13 last_message_not_user
        {**rft_row(101), "messages": []},                                  # 14 messages_not_list
        {**rft_row(102), "messages": [{"role": "user", "content": ""}]},   # 15 empty_content
        {"answer": "5"},                                                   # 16 unknown_schema
    ]
    r = kit.run_gate(kit.write_jsonl(tmp_path / "bad.jsonl", bad), tmp_path / "bad").report.as_dict()
    got = kit.errors(r)
    assert not r["accepted"] and r["schema"] == "rft"
    assert got[13] == ["last_message_not_user"] and "messages[2].role is 'assistant'" in next(
        e["message"] for e in r["errors"] if e["line"] == 13)
    assert got[14] == ["messages_not_list"] and got[15] == ["empty_content"] and got[16] == ["unknown_schema"]
    assert set(got) == {13, 14, 15, 16}

    # a supervised file still needs its assistant turns: purpose sft reads the same rows as chat
    sft = kit.run_gate(path, tmp_path / "sft", request=GateRequest(purpose="sft")).report.as_dict()
    assert not sft["accepted"] and sft["schema"] == "chat" and sft["error_counts"]["no_assistant"] == 20
    # and a chat file (first row with an answer) reports a row without one as no_assistant, not as rft
    mixed = kit.good_rows(12) + [{"messages": [{"role": "user", "content": "q"}], "answer": "x"}]
    m = kit.run_gate(kit.write_jsonl(tmp_path / "m.jsonl", mixed), tmp_path / "m").report.as_dict()
    assert m["schema"] == "chat" and kit.errors(m)[13] == ["no_assistant"]
