"""Which training files a job may name: the pure rule and the file ids it trusts."""

import pytest

from whetstone.contracts.events import ValidationIssue
from whetstone.runtime.file_ids import mint_file_id, minted_for
from whetstone.scheduler.domain.files import FileFacts, refusal

pytestmark = pytest.mark.unit
SECRET, OTHER_SECRET = b"s" * 32, b"t" * 32


def facts(file_id: str = "file-x", **kw) -> FileFacts:
    base = {"status": None, "errors": [], "submitted": False, "deleted": False, "minted": False}
    return FileFacts(file_id, **{**base, **kw})


def test_file_ids_verify_only_for_the_tenant_and_secret_that_minted_them():
    a = mint_file_id("demo", SECRET)
    assert a.startswith("file-") and len(a) == 45 and a != mint_file_id("demo", SECRET)
    assert minted_for(a, "demo", SECRET)
    assert not minted_for(a, "acme", SECRET)                 # another tenant's upload
    assert not minted_for(a, "demo", OTHER_SECRET)           # not this platform's
    assert not minted_for(a[:-1] + ("0" if a[-1] != "0" else "1"), "demo", SECRET)   # one digit changed
    assert not minted_for("file-" + "0" * 40, "demo", SECRET) and not minted_for("ds-" + "0" * 24, "demo", SECRET)


def test_deleted_rejected_and_unknown_files_are_refused_naming_the_file():
    gone = refusal(facts(status="accepted", deleted=True, minted=True))
    assert gone and gone.code == "training_file_deleted" and gone.param == "training_file" and "file-x" in gone.message
    bad = refusal(facts(status="rejected", errors=[ValidationIssue(code="bad_json", line=13, message="not JSON"),
                                                ValidationIssue(code="too_few_rows", message="too few rows")]))
    assert bad and bad.code == "invalid_training_file" and "line 13: not JSON; too few rows" in bad.message
    unknown = refusal(facts("file-nope"))
    assert unknown and unknown.code == "training_file_not_found" and "file-nope" in unknown.message
    held_out = refusal(facts("file-nope"), param="validation_file")   # the same rule names the validation file
    assert held_out and (held_out.code, held_out.param) == ("validation_file_not_found", "validation_file")
    assert held_out.message.startswith("validation_file 'file-nope'")


def test_files_whose_verdict_is_coming_or_accepted_are_not_refused():
    assert refusal(facts(minted=True)) is None                     # uploaded; dataset.submitted not heard yet
    assert refusal(facts(submitted=True)) is None                  # being validated
    assert refusal(facts(status="accepted")) is None
    assert refusal(facts("ds-" + "a" * 24)) is None                # content address: a producer may publish it


def test_the_scheduler_trusts_ids_minted_with_the_file_id_key_and_those_minted_before_it(monkeypatch, tmp_path):
    """Ingest mints with the file-id key derived from the internal secret (it never holds the secret); the
    scheduler derives the same key, and still trusts an id minted with the secret itself before the split."""
    from types import SimpleNamespace

    from whetstone.runtime.file_ids import derive_file_id_key
    from whetstone.scheduler.usecases.training_files import minted

    monkeypatch.setenv("WHETSTONE_INTERNAL_SECRET", SECRET.decode())
    monkeypatch.delenv("WHETSTONE_FILE_ID_KEY", raising=False)
    rt = SimpleNamespace(settings=SimpleNamespace(data_dir=tmp_path))
    new, legacy = mint_file_id("demo", derive_file_id_key(SECRET)), mint_file_id("demo", SECRET)
    assert minted(rt, new, "demo") and minted(rt, legacy, "demo")
    assert not minted(rt, new, "acme") and not minted(rt, mint_file_id("demo", derive_file_id_key(OTHER_SECRET)),
                                                        "demo")
