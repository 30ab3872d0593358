"""The base model a segment trains from is the one admission pinned: a catalog model by the sha256 of
its weights, a Hub id by the commit recorded at admission (its snapshot from the Hugging Face cache,
never the repository's current head). Hub calls are switched off: the cache answers or nothing does."""

from pathlib import Path

import pytest
from huggingface_hub import constants

from whetstone.runtime.models import UnknownModel, weights_sha256
from whetstone.trainer_agent.adapters.workspace import pinned_base

PINNED = "a" * 40


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf"
    snapshot = cache / "models--org--tiny" / "snapshots" / PINNED
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_a_hub_base_loads_the_snapshot_of_the_pinned_commit(hub_cache, tmp_path):
    model = pinned_base("org/tiny", PINNED, tmp_path / "catalog")
    assert (model.location, model.sha256) == (str(hub_cache), PINNED)
    # a commit the cache (offline) or the Hub no longer has: refused naming the model and the revision
    with pytest.raises(UnknownModel, match=r"model: Hub base 'org/tiny' at the revision pinned at admission \(b{40}\)"):
        pinned_base("org/tiny", "b" * 40, tmp_path / "catalog")


def test_a_catalog_base_must_still_hash_to_its_pin(tmp_path):
    base = tmp_path / "catalog" / "tiny"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"weights")
    sha = weights_sha256(base)
    assert pinned_base("tiny", sha, tmp_path / "catalog").location == str(base.resolve())
    with pytest.raises(UnknownModel, match="job pinned"):
        pinned_base("tiny", "0" * 64, tmp_path / "catalog")
