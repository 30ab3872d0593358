"""What a tenant may name as a base model: a catalog name or an allow-listed Hub
id, never a path; a refusal never shows where the catalog lives."""

import pytest
from whetstone.runtime.models import HubEntry, UnknownModel, resolve_hub, resolve_model, tenant_reference

pytestmark = pytest.mark.unit


def test_a_tenant_names_catalog_models_or_allow_listed_hub_ids_never_paths(tmp_path):
    catalog = tmp_path / "secret-place" / "models"
    (catalog / "tiny-llama").mkdir(parents=True)
    (catalog / "tiny-llama" / "config.json").write_text("{}")
    (catalog / "org" / "base").mkdir(parents=True)
    (catalog / "org" / "base" / "config.json").write_text("{}")
    outside = tmp_path / "tenant-b-model"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    hub = {"meta-llama/Llama-3.2-1B": HubEntry.parse("meta-llama/Llama-3.2-1B@" + "a" * 40)}
    assert tenant_reference("tiny-llama", catalog, hub) == "catalog"
    assert tenant_reference("org/base", catalog, hub) == "catalog"
    assert tenant_reference("meta-llama/Llama-3.2-1B", catalog, hub) == "hub"
    for ref in ("/etc", str(outside), str(catalog / "tiny-llama"), "./tiny-llama", "../models/tiny-llama",
                "tiny-llama/../../tenant-b-model", "~/models", "org/base/../../..", "a\\b", "x\x00",
                "meta-llama/Llama-3.2-8B", "someone/else", "no-such-model", "org/base/deeper/still"):
        with pytest.raises(UnknownModel) as exc:
            tenant_reference(ref, catalog, hub)
        told = str(exc.value).replace(repr(ref[:120]), "")    # the tenant's own words aside
        assert "secret-place" not in told and str(tmp_path) not in told, told
    # no error of the resolver names the catalog's place (a catalog entry without weights included)
    for ref in ("no such model!", "tiny-llama"):
        with pytest.raises(UnknownModel) as exc:
            resolve_model(ref, catalog)
        assert "secret-place" not in str(exc.value), str(exc.value)


def test_hub_entries_pin_a_commit_and_need_no_hub_call_when_pinned():
    entry = HubEntry.parse("org/name@" + "b" * 40)
    assert (entry.repo_id, entry.revision) == ("org/name", "b" * 40)
    model = resolve_hub(entry)                     # offline: the operator's pin, no network
    assert (model.location, model.sha256, model.local) == ("org/name", "b" * 40, False)
    assert HubEntry.parse("org/name").revision is None
    for bad in ("/etc", "org/name@main", "name-only", "org/name@" + "z" * 40):
        with pytest.raises(ValueError):
            HubEntry.parse(bad)
