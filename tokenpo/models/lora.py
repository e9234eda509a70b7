"""LoRA adapters on the policy (model.lora.*, built with PEFT), the base model as the KL reference, merged weights.

With `model.lora.rank` >= 1 the loaded model is wrapped in a PEFT model before DeepSpeed sees it: only the
adapters (and `modules_to_save`) require grad, so only they get gradients and AdamW states. The frozen base with
its adapters switched off (`adapters_disabled`) is the initial policy (every allowed init starts with B = 0), so the
KL reference costs no second copy of the weights. `merged_state_dict` turns the adapted model's state into the plain
model's, W + (alpha / r) B A per adapted module, as new tensors: the live training weights are never changed;
`merged_layer_weights` and `streamed_instead` do the same layer by layer for the weight sync to a rollout engine
(tokenpo.models.weight_stream), which thus needs no LoRA support and runs the adapted model at the base model's speed
(verl and OpenRLHF sync LoRA policies to vLLM the same way).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from peft.tuners.lora import Embedding, Linear, LoraLayer
from peft.utils import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

from tokenpo.errors import ConfigError
from tokenpo.models.config import ALL_LINEAR, LORA_INITS, LoraConfig, ModelConfig

# how PEFT names what it adds: "<prefix><module>.base_layer.weight", "<module>.lora_A.<adapter>.weight", ...
PEFT_PREFIX = "base_model.model."
ADAPTER = "default"
BASE_LAYER = ".base_layer."
LORA_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")
SAVED_COPY = f".modules_to_save.{ADAPTER}."
ORIGINAL = ".original_module."


def is_lora(model) -> bool:
    return isinstance(model, PeftModel)


def base_model(module: torch.nn.Module) -> torch.nn.Module:
    """The model a PEFT wrapper holds (its LoRA layers in place), whose parameter names are the base model's;
    any other module as it is."""
    return module.get_base_model() if is_lora(module) else module


def module_names(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def check_targets(names: list[str], cfg: LoraConfig) -> None:
    """Every module named in model.lora.target_modules / modules_to_save exists (PEFT matches the full name or its
    last components); one line naming the key otherwise. `names`: the model's module names."""
    for key, wanted in (("target_modules", cfg.target_modules), ("modules_to_save", cfg.modules_to_save)):
        if wanted == ALL_LINEAR:
            continue
        missing = [w for w in wanted if not any(n == w or n.endswith("." + w) for n in names)]
        if missing:
            leaves = sorted({n.rsplit(".", 1)[-1] for n in names if not n.rsplit(".", 1)[-1].isdigit()})
            raise ConfigError(f"model.lora.{key}: the model has no module named {', '.join(map(repr, missing))} "
                              f"(its modules: {', '.join(leaves)})")


def check_targets_before_loading(cfg: ModelConfig) -> None:
    """Start-up check of model.lora.target_modules / modules_to_save against the model's architecture, built on the
    meta device from its config.json (no weights, no memory). Skipped where no config.json is at hand or transformers
    cannot build the architecture from it: `wrap_lora` checks again once the model is loaded."""
    lora = cfg.lora
    if not lora.enabled or (lora.target_modules == ALL_LINEAR and not lora.modules_to_save):
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    from tokenpo.models.loading import build_tiny_model
    from tokenpo.plan.architecture import find_config_json

    with torch.device("meta"):
        if cfg.source == "tiny":
            skeleton = build_tiny_model(cfg, vocab_size=8, seed=0)
        else:
            try:
                config = AutoConfig.for_model(**find_config_json(cfg)[0])
                skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
            except (ConfigError, ValueError, KeyError, TypeError, ImportError):
                return
    check_targets(module_names(skeleton), lora)


def peft_config(cfg: LoraConfig) -> PeftLoraConfig:
    target = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    return PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=target,
                          init_lora_weights=LORA_INITS[str(cfg.init).lower()],
                          modules_to_save=list(cfg.modules_to_save) or None, task_type="CAUSAL_LM")


@contextlib.contextmanager
def peft_quietly():
    """PEFT reads transformers' deprecated is_gradient_checkpointing when it wraps a model (a FutureWarning each
    time)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        yield


def wrap_lora(model, cfg: LoraConfig):
    """The model with LoRA adapters (a PeftModel sharing the model's weights); only adapter parameters train.

    Under activation checkpointing PEFT makes the (frozen) embeddings' output require grad: a checkpointed block
    whose inputs need no grad would give its adapters none (tests/models/test_lora.py checks the gradients)."""
    check_targets(module_names(model), cfg)
    try:
        with peft_quietly():
            return get_peft_model(model, peft_config(cfg))
    except (ValueError, TypeError, NotImplementedError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"model.lora: PEFT cannot add LoRA adapters to this {type(model).__name__} "
                          f"(target_modules={cfg.target_modules!r}): {first}") from err


def adapters_disabled(model):
    """Context in which `model` (a PeftModel) computes as its frozen base: the KL reference of a LoRA run."""
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def lora_scaling(model: PeftModel) -> float:
    """The factor of B A in W + factor * B A of `model`'s adapters (PEFT's lora_alpha / r)."""
    config = model.peft_config[ADAPTER]
    return config.lora_alpha / (config.r ** 0.5 if config.use_rslora else config.r)


def merged_weight(base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
                  transpose: bool) -> torch.Tensor:
    """W + scaling * B A as a new tensor in W's dtype (the product in fp32). `transpose`: W is stored [in, out]
    (embeddings; GPT-2's Conv1D, PEFT's fan_in_fan_out), said by the caller: a square layer's shapes cannot tell."""
    delta = lora_b.float() @ lora_a.float()
    if transpose:
        delta = delta.T
    return (base.float() + scaling * delta).to(base.dtype)


def merged_layer_weights(layer: torch.nn.Module, prefix: str, gathered: Callable[[list], contextlib.AbstractContextManager],
                         owned: Callable[[torch.Tensor], torch.Tensor]) -> list[tuple[str, torch.Tensor]] | None:
    """A LoRA layer's base parameters with its active adapters merged in, as `prefix.weight` (and `.bias`); None for
    any other module. `gathered(params)`: a context in which `params` hold their full data (ZeRO-3 shards gathered);
    `owned(tensor)`: a copy that outlives it (the merged weight is a new tensor already)."""
    if not isinstance(layer, LoraLayer):
        return None
    if not isinstance(layer, (Linear, Embedding)):
        raise ConfigError(f"model.lora: the merged-weight sync to the rollout engine handles LoRA on Linear and "
                          f"Embedding layers; {prefix} is a {type(layer).__name__}")
    embedding = isinstance(layer, Embedding)
    # what the layer's forward adds: nothing while adapters are off or already merged into the base weight
    adapters = [] if layer.disable_adapters or layer.merged else [
        a for a in layer.active_adapters if a in (layer.lora_embedding_A if embedding else layer.lora_A)]
    for adapter in adapters:
        if adapter in layer.lora_variant or layer.lora_bias.get(adapter):
            raise ConfigError(f"model.lora: the merged-weight sync handles plain LoRA (W + scale·B·A); {prefix} has "
                              f"a LoRA variant or bias for adapter {adapter!r}")
    base = layer.get_base_layer()
    with gathered(list(layer.parameters())):
        weight = base.weight.detach()
        for adapter in adapters:
            if embedding:
                a, b = layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter]
            else:
                a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            weight = merged_weight(weight, a.detach(), b.detach(), layer.scaling[adapter],
                                   embedding or getattr(layer, "fan_in_fan_out", False))
        out = [(f"{prefix}.weight", weight if adapters else owned(weight))]
        if getattr(base, "bias", None) is not None:
            out.append((f"{prefix}.bias", owned(base.bias.detach())))
    return out


def streamed_instead(module: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """The module whose weights stand for PEFT's wrapper `module` under the wrapped module's name: the trained copy of
    a `modules_to_save` module while its adapter is active, else the original; None for a module PEFT did not wrap."""
    if isinstance(module, ModulesToSaveWrapper):
        active = module.active_adapters
        return module.modules_to_save[active[0]] if active else module.original_module
    if isinstance(module, AuxiliaryTrainingWrapper):
        raise ConfigError(f"model.lora: the merged-weight sync has no rule for PEFT's {type(module).__name__} "
                          f"({name})")
    return None


def adapter_factors(state: dict[str, torch.Tensor], module: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(A, B, whether B A is stored transposed) of the adapted module `module` (its PEFT name) in `state`: a linear
    layer's factors, or an embedding's (whose weight is [vocabulary, dim] while B A is [dim, vocabulary])."""
    linear = f"{module}.lora_A.{ADAPTER}.weight"
    if linear in state:
        return state[linear], state[f"{module}.lora_B.{ADAPTER}.weight"], False
    return state[f"{module}.lora_embedding_A.{ADAPTER}"], state[f"{module}.lora_embedding_B.{ADAPTER}"], True


def plain_name(peft_name: str) -> str | None:
    """The plain model's name of a PEFT parameter or buffer; None for adapter factors and saved originals."""
    name = peft_name.removeprefix(PEFT_PREFIX)
    if any(part in name for part in LORA_PARTS) or ORIGINAL in name:
        return None
    return name.replace(BASE_LAYER, ".").replace(SAVED_COPY, ".")


def merged_state_dict(state: dict[str, torch.Tensor], scaling: float,
                      fan_in_fan_out: bool = False) -> dict[str, torch.Tensor]:
    """The plain model's state dict from the PEFT model's: every adapted weight merged, trained copies of
    `modules_to_save` in place of the originals. `state` is read, never changed. `fan_in_fan_out`: the model's
    linear layers store W as [in, out] (PEFT's LoraConfig.fan_in_fan_out, GPT-2's Conv1D)."""
    merged = {}
    for peft_name, tensor in state.items():
        name = plain_name(peft_name)
        if name is None:
            continue
        module, sep, leaf = peft_name.partition(BASE_LAYER)
        if sep and leaf == "weight":
            lora_a, lora_b, embedding = adapter_factors(state, module)
            tensor = merged_weight(tensor, lora_a, lora_b, scaling, embedding or fan_in_fan_out)
        merged[name] = tensor
    return merged


def save_merged_and_adapter(model: PeftModel, out: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """`model` written twice: merged into its base weights in `out` (a plain model, W + (alpha / r) B A) and as the PEFT
    adapter in `out/adapter` (PeftModel.from_pretrained on the base model). `state`: the model's state dict where it is
    not the module's own (gathered from ZeRO-3 shards). The live weights are never changed.

    The merged model never exists as a whole: transformers writes the plain model's files from the unmerged weights
    (the live tensors, no copy: its own names, tied weights, shards, config), then each adapted weight is merged and
    written over its unmerged bytes in those files, one layer at a time (`merge_into_saved`). Merging the whole state
    dict first held a merged copy of every adapted weight beside the model: about one model in the training dtype
    (423 MiB at SmolLM2-135M in fp32, 14 GB for a 7B in bf16), the LoRA run's peak (docs/lora.md)."""
    state = model.state_dict() if state is None else state
    model.save_pretrained(out / "adapter", state_dict=state)
    scaling, fan_in_fan_out = lora_scaling(model), model.peft_config[ADAPTER].fan_in_fan_out
    base = model.get_base_model()
    adapted = {}  # plain name of each adapted weight -> its module's PEFT name
    for peft_name in state:
        module, sep, leaf = peft_name.partition(BASE_LAYER)
        if sep and leaf == "weight":
            adapted[plain_name(peft_name)] = module
    plain = {name: tensor for peft_name, tensor in state.items() if (name := plain_name(peft_name)) is not None}
    # an adapted weight that shares its storage with another saved tensor (an adapted embedding tied to the output
    # layer) gets its own copy, so that transformers keeps both names, as the merged state dict had them apart
    others = {tensor.untyped_storage().data_ptr() for name, tensor in plain.items() if name not in adapted}
    for name in adapted:
        if plain[name].untyped_storage().data_ptr() in others:
            plain[name] = plain[name].clone()
    base.save_pretrained(out, state_dict=plain)
    del plain
    if not merge_into_saved(out, state, adapted, scaling, fan_in_fan_out):
        base.save_pretrained(out, state_dict=merged_state_dict(state, scaling, fan_in_fan_out))


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def safetensors_layout(out: Path) -> dict[str, tuple[Path, int, str, list[int]]] | None:
    """{tensor name: (file, byte offset of its data, dtype, shape)} of the safetensors model in `out` (one file or an
    index of shards); None where it has none."""
    index = out / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({out / f for f in json.loads(index.read_text())["weight_map"].values()})
    elif (out / "model.safetensors").is_file():
        files = [out / "model.safetensors"]
    else:
        return None
    layout = {}
    for file in files:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                layout[name] = (file, 8 + size + entry["data_offsets"][0], entry["dtype"], entry["shape"])
    return layout


def merge_into_saved(out: Path, state: dict[str, torch.Tensor], adapted: dict[str, str], scaling: float,
                     fan_in_fan_out: bool) -> bool:
    """Each adapted weight of the plain model saved in `out` (`adapted`: plain name -> the PEFT module name in `state`)
    overwritten in its file by W + scaling B A, computed one at a time; False (nothing written) where the saved
    files do not hold every adapted weight by its plain name, with its shape and dtype."""
    layout = safetensors_layout(out)
    if layout is None:
        return False
    for name, module in adapted.items():
        weight = state[f"{module}{BASE_LAYER}weight"]
        entry = layout.get(name)
        if entry is None or SAFETENSORS_DTYPES.get(entry[2]) != weight.dtype or list(entry[3]) != list(weight.shape):
            return False
    for name, module in adapted.items():
        file, offset, _, _ = layout[name]
        lora_a, lora_b, embedding = adapter_factors(state, module)
        merged = merged_weight(state[f"{module}{BASE_LAYER}weight"], lora_a, lora_b, scaling,
                               embedding or fan_in_fan_out)
        data = merged.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        with open(file, "r+b") as f:
            f.seek(offset)
            f.write(memoryview(data))
        del merged, data
    return True


ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).is_file()


def adapter_base(folder: Path) -> str | None:
    """The base model an adapter folder was trained on (PEFT's base_model_name_or_path: a folder or a hub id)."""
    try:
        return json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or None
    except ValueError as err:
        raise ConfigError(f"{folder / ADAPTER_CONFIG}: not JSON ({err})") from None


def with_adapter(model, folder: Path):
    """`model` with the PEFT adapter in `folder` merged into its weights (for inference: the plain model's speed)."""
    try:
        with peft_quietly():
            return PeftModel.from_pretrained(model, folder).merge_and_unload()
    except (ValueError, KeyError, RuntimeError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"adapter_path {str(folder)!r} does not fit the model {type(model).__name__}: "
                          f"{first}") from err
