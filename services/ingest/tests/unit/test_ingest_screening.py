"""Contamination, PII, toxicity, statistics, cost and policies."""

import json
import random
import re
import struct

import numpy as np
import pytest
from pydantic import ValidationError

from whetstone.ingest.adapters.plugins import load_toxicity_classifier
from whetstone.ingest.domain import pii
from whetstone.ingest.domain.contamination import NgramHasher, ReferenceIndex, is_contaminated, words
from whetstone.ingest.domain.cost import METHODS_FOR_PURPOSE, estimate_cost
from whetstone.ingest.domain.policies import Policies, PolicyError, PolicyOverrides
from whetstone.ingest.domain.stats import Bucket, DatasetStats, histogram
from whetstone.ingest.domain.text import normalize_text
from whetstone.ingest.domain.toxicity import WordlistToxicity

pytestmark = pytest.mark.unit

QUESTION = ("Which of the following best describes the primary function of the mitochondria in eukaryotic cells "
            "and how does it relate to cellular respiration and the production of adenosine triphosphate")


# ------------------------------------------------------------------ contamination


def test_words_are_lowercase_alphanumeric_runs():
    assert words("The dog's BALL, 42 times!") == [b"the", b"dog", b"s", b"ball", b"42", b"times"]
    assert words("Ünïcode wörds") == ["ünïcode".encode(), "wörds".encode()]


def test_ngrams_never_cross_texts_in_a_batch():
    h = NgramHasher(n=3)
    batch = h.batch(["a b c d", "e f", "g h i"])
    assert batch.counts.tolist() == [2, 0, 1]
    alone = h.batch(["g h i"]).hashes
    assert batch.hashes[batch.docs == 2].tolist() == alone.tolist()


def test_word_hashes_compare_words_on_their_first_24_bytes_in_any_window(monkeypatch):
    from whetstone.ingest.domain import contamination

    long_a, long_b = "x" * 24 + "tail", "x" * 24 + "other"
    texts = [f"{long_a} Dog dog. {long_b} x{'y' * 22}z x{'y' * 22}q", "", "dog", "ünï DOG"]
    whole, docs = NgramHasher().word_hashes(texts)
    assert docs.tolist() == [0] * 6 + [2, 3, 3]
    h = whole.tolist()
    assert h[0] == h[3] and h[1] == h[2] == h[6] == h[8] and h[4] != h[5] and len(set(h)) == 5
    for window in (8, 30):          # hashed a few bytes at a time (a 28-byte word overruns 8): the same hashes
        monkeypatch.setattr(contamination, "_WINDOW_BYTES", window)
        windowed, windowed_docs = NgramHasher().word_hashes(texts)
        assert windowed.tolist() == h and windowed_docs.tolist() == docs.tolist()
    assert NgramHasher().word_hashes(["", " .,"])[0].size == 0


def test_contamination_fraction_and_threshold():
    index = ReferenceIndex()
    index.add("mmlu", [QUESTION, "another unrelated benchmark item with enough words to form a few thirteen grams ok"])
    index.add("tenant-eval", ["completely different text that belongs to the tenant's own eval set and is long enough"])
    clean = "This sentence has nothing to do with any benchmark question at all and should never match anything."
    copied = "Q: " + QUESTION.upper() + "?!"
    half = QUESTION + " " + " ".join(f"filler{i}" for i in range(40))
    fractions, names = index.match([clean, copied, half, "short"])
    assert fractions[0] == 0 and names[0] is None
    assert fractions[1] > 0.8 and names[1] == "mmlu"
    assert 0 < fractions[2] < 0.5
    assert fractions[3] == 0
    assert is_contaminated(0.51, 0.5) and not is_contaminated(0.5, 0.5)
    assert index.describe()["mmlu"]["items"] == 2 and index.nbytes > 0
    assert not ReferenceIndex()


# ---------------------------------------------------------------------------- PII


@pytest.mark.parametrize("text, kind, value", [
    ("write to jane.doe+tag@mail.example.org today", "email", "jane.doe+tag@mail.example.org"),
    ("call (555) 123-4567 now", "phone", "(555) 123-4567"),
    ("call +44 20 7946 0958 now", "phone", "+44 20 7946 0958"),
    ("card 4111 1111 1111 1111 ok", "credit_card", "4111 1111 1111 1111"),
    ("card 5500-0000-0000-0004 ok", "credit_card", "5500-0000-0000-0004"),
    ("iban DE89 3704 0044 0532 0130 00 ok", "iban", "DE89 3704 0044 0532 0130 00"),
    ("iban GB82WEST12345698765432 ok", "iban", "GB82WEST12345698765432"),
    ("ssn 123-45-6789 ok", "ssn", "123-45-6789"),
    ("from 10.0.12.7 today", "ip_address", "10.0.12.7"),
    ("from 2001:db8:85a3::8a2e:370:7334 today", "ip_address", "2001:db8:85a3::8a2e:370:7334"),
    ("key AKIAIOSFODNN7EXAMPLE here", "secret", "AKIAIOSFODNN7EXAMPLE"),
    ("token ghp_" + "A1b2" * 9 + " here", "secret", "ghp_" + "A1b2" * 9),
    ("use sk-proj-abcdefghij0123456789XYZ please", "secret", "sk-proj-abcdefghij0123456789XYZ"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "secret", "-----BEGIN RSA PRIVATE KEY-----"),
])
def test_pii_kinds(text, kind, value):
    found = pii.scan(text)
    assert [(m.kind, text[m.start:m.end]) for m in found] == [(kind, value)]


def test_password_assignment_is_a_secret():
    found = pii.scan('config: password = "hunter2isnotsecure99"')
    assert [m.kind for m in found] == ["secret"]


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1112 fails Luhn",
    "ssn 000-12-3456 and 666-12-3456 and 900-12-3456 are never issued",
    "999.1.1.1 is not an address; version 1.2.3 is not either",
    "the year 2024-01-15 and 3.14159 and 1,000,000 people",
    "std::vector<int> and a::b are code",
    "my key point is the password reset flow",
    "",
])
def test_pii_negatives(text):
    assert pii.scan(text) == []


@pytest.mark.parametrize("text", ["x AKIA1234", "ghp_abc", "abc xoxb-1", "eyJhbGc", "-----BEGIN RSA", "sk-abc",
                                  "my AIza", "ASIA", "Is it plain text", "hf-", "gh p_", "AKI A"])
def test_secret_hint_prefilter_equals_scanning_every_hint(text):
    assert pii._has_hint(text) == any(h in text for h in pii._SECRET_HINTS)


# the secret-token pattern as first written: one alternation, each alternative starting with \b
WORD_BOUNDARY_FIRST = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{36,255}\b|\bgithub_pat_[A-Za-z0-9_]{22,255}\b"
    r"|\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|\b[rs]k_live_[A-Za-z0-9]{20,}|\bxox[abpr]-[A-Za-z0-9-]{10,}"
    r"|\bAIza[0-9A-Za-z_-]{35}|\bglpat-[A-Za-z0-9_-]{20,}|\bhf_[A-Za-z]{30,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}|-----BEGIN [A-Z ]*PRIVATE KEY-----")


def test_secret_tokens_match_exactly_as_the_word_boundary_first_pattern():
    """Literal first with the boundary behind it, and only the kinds whose hints occur: the same spans
    as the original alternation, on texts built from the tokens' pieces, boundaries and near misses."""
    rng = random.Random(5)
    pieces = ["AKIA", "ASIA", "ghp_", "gho_", "ghr_", "github_pat_", "sk-", "sk-proj-", "sk-ant-", "rk_live_",
              "sk_live_", "xoxb-", "xoxp-", "xox", "AIza", "glpat-", "hf_", "eyJ", ".eyJ", "-----BEGIN ", "RSA ",
              "PRIVATE KEY-----", "a", "Z", "0", "_", "-", " ", "\n", ".", "\u00e9", "ABCDEFGHIJKLMNOP",
              "abcdefghij0123456789", "Q" * 12, "k", "r", "s", "=", "/", "risk-", "boxox"]
    matched = 0
    for _ in range(4_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        want = [m.span() for m in WORD_BOUNDARY_FIRST.finditer(text)]
        got = [m.span() for m in pii._secret_token(text).finditer(text)] if pii._has_hint(text) else []
        assert got == want, text
        matched += bool(want)
    assert matched > 200                       # the texts did hold tokens, not only near misses


def test_an_iban_failing_mod_97_is_not_an_iban():
    assert "iban" not in {m.kind for m in pii.scan("iban DE00 3704 0044 0532 0130 00 fails mod 97")}


def test_luhn_and_iban_checks():
    assert pii.luhn_ok("4111111111111111") and not pii.luhn_ok("4111111111111112")
    assert not pii.luhn_ok("12345")
    assert pii.iban_ok("DE89 3704 0044 0532 0130 00") and not pii.iban_ok("DE89 3704 0044 0532 0130 01")


def test_redaction_and_overlaps():
    text = "mail a@b.io or call 555-123-4567, ssn 123-45-6789"
    found = pii.scan(text)
    assert [m.kind for m in found] == ["email", "phone", "ssn"]
    assert pii.redact(text, found) == "mail [EMAIL] or call [PHONE], ssn [SSN]"


# ----------------------------------------------------------------------- toxicity


def test_builtin_toxicity_and_plugins():
    clf = WordlistToxicity(extra_terms=["frobnicate", "go away now"])
    scores = clf.scores(["Have a nice day", "you BITCH", "shit, kill yourself", "please frobnicate", "go away now!"])
    assert scores == [0.0, 0.5, 1.0, 0.5, 0.5]
    assert load_toxicity_classifier("off") is None
    assert isinstance(load_toxicity_classifier("builtin"), WordlistToxicity)
    plugged = load_toxicity_classifier("whetstone.ingest.domain.toxicity:WordlistToxicity")
    assert plugged.scores(["shit"]) == [0.5]
    with pytest.raises(ValueError):
        load_toxicity_classifier("no-colon")


@pytest.mark.parametrize("extra", [(), ("frobnicate", "f*ck", "scheiße", "x" * 30), ("shit", "dam")])
def test_toxicity_from_shared_word_hashes_equals_scoring_each_text(extra):
    """The gate scores the word list from the word hashes contamination computed (ASCII texts); the
    result must be exactly `scores` for any text: terms inside words, case, punctuation, phrases
    across whitespace runs, non-ASCII, terms that cannot be words, a term too long for its hash."""
    clf = WordlistToxicity(extra_terms=list(extra))
    rng = np.random.default_rng(3)
    vocab = ["shit", "Shit", "shitty", "bullshit", "BITCH", "fucking", "unfuckable", "kill  yourself",
             "kill yourself", "frobnicate", "f*ck", "scheiße", "dam", "damn", "x" * 30, "x" * 31, "you", "die",
             "go die", "hello", "wörld", "1337", "shit.", "(bitch)", "cunt\nwhore", "\t", "retarded"]
    texts = ["Have a nice day", "", "you BITCH"]
    texts += [" ".join(rng.choice(vocab, size=rng.integers(1, 12)).tolist()) for _ in range(400)]
    word_hash, word_doc = NgramHasher().word_hashes([normalize_text(t) for t in texts])
    assert clf.scores_with_words(texts, word_hash, word_doc) == clf.scores(texts)


# -------------------------------------------------------------------------- stats


def test_histogram_and_summary():
    h = histogram(np.array([0, 5, 40, 40, 300]))
    assert [b.count for b in h] == [2, 2, 0, 0, 1] and h[-1] == Bucket(min=256, max=512, count=1)
    stats = DatasetStats()
    for n in [10, 12, 11, 13, 500]:
        stats.add(n, {"user": 1, "assistant": 1}, trained=n // 2)
    stats.add(9, {"system": 1, "user": 5, "assistant": 5})
    s = stats.summary()
    assert s.tokens["total"] == 555 and s.tokens["max"] == 500 and s.tokens["p50"] == 11
    assert s.roles == {"assistant": 10, "system": 1, "user": 10}
    assert s.turns == {"2": 5, "9+": 1}
    assert s.length_outliers == 1 and s.trained_tokens == 272
    assert DatasetStats().summary().tokens == {"rows": 0, "total": 0}


# --------------------------------------------------------------------------- cost


def test_cost_estimate_per_gpu_and_method():
    est = estimate_cost(1_000_000, 3, "sft", 7_000_000_000)
    methods = {r.method for r in est.estimates}
    assert methods == set(METHODS_FOR_PURPOSE["sft"])
    h100_lora = next(r for r in est.estimates if r.gpu_type == "H100" and r.method == "lora")
    assert h100_lora.gpu_hours == pytest.approx(3_000_000 / 3400 / 3600, rel=1e-3)
    assert h100_lora.spot_usd < h100_lora.on_demand_usd
    assert est.cheapest == min(est.estimates, key=lambda r: r.spot_usd)
    bigger = estimate_cost(1_000_000, 3, "sft", 70_000_000_000)
    assert bigger.cheapest and est.cheapest and bigger.cheapest.gpu_hours > est.cheapest.gpu_hours * 5
    tiny = estimate_cost(1_000_000, 3, "sft", 1000)
    assert tiny.estimates[0].tokens_per_s_per_gpu <= 20 * 3400
    assert {r.method for r in estimate_cost(10, 1, "dpo", None).estimates} == {"dpo", "orpo"}
    custom = estimate_cost(3600, 1, "cpt", None, throughput={"X": {"cpt": 1.0}}, prices={"X": {"on_demand": 2,
                                                                                              "spot": 1}})
    assert custom.as_dict()["estimates"] == [{"gpu_type": "X", "method": "cpt", "tokens_per_s_per_gpu": 1.0,
                                              "gpu_hours": 1.0, "on_demand_usd": 2.0, "spot_usd": 1.0}]
    assert custom.as_dict()["cheapest"] == custom.as_dict()["estimates"][0]
    assert estimate_cost(10, 1, "eval", None).cheapest is None


# ----------------------------------------------------------------------- policies


def test_policies():
    p = Policies().merged(PolicyOverrides(pii="redact", max_seq_len=512, over_length=None))
    assert p.pii == "redact" and p.max_seq_len == 512 and p.over_length == "truncate"
    assert p.as_strings()["max_seq_len"] == "512"
    with pytest.raises(PolicyError):
        Policies(pii="ignore")
    with pytest.raises(PolicyError):
        Policies(near_dup_threshold=1.5)
    with pytest.raises(ValidationError, match="bogus"):      # an unknown name is refused where it is read
        PolicyOverrides.model_validate({"bogus": 1})
    with pytest.raises(PolicyError):                         # a value is checked where it is applied
        Policies().merged(PolicyOverrides(pii="ignore"))


def test_model_params_from_a_config_without_weights(tmp_path):
    from whetstone.ingest.adapters.tokenizer import model_params

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "model_type": "llama"}))
    assert model_params(str(tmp_path)) == (2 * (4 * 64 * 64 + 3 * 64 * 256) + 2 * 100 * 64, "config")  # 4x hidden
    config.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 8}))
    assert model_params(str(tmp_path)) == (2 * (4 * 64 * 64 + 3 * 64 * 8) + 2 * 100 * 64, "config")
    config.write_text(json.dumps({"hidden_size": 64}))                 # too little to count: the default
    assert model_params(str(tmp_path)) == (None, "default")
    assert model_params(str(tmp_path / "absent")) == (None, "default")


def _safetensors(path, header: dict) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body)


def test_model_params_from_safetensors_headers_else_the_config(tmp_path):
    from whetstone.ingest.adapters.tokenizer import model_params

    _safetensors(tmp_path / "a.safetensors", {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [3, 4]}})
    _safetensors(tmp_path / "b.safetensors", {"bias": {"dtype": "F32", "shape": [5]}, "scale": {"dtype": "F32", "shape": []}})
    assert model_params(str(tmp_path)) == (12 + 5 + 1, "safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100}))
    _safetensors(tmp_path / "b.safetensors", {"bias": "not a tensor"})      # not a safetensors header: the config
    assert model_params(str(tmp_path)) == (2 * (4 * 64 * 64 + 3 * 64 * 256) + 2 * 100 * 64, "config")
