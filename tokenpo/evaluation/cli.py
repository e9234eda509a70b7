"""Stand-alone evaluation of a checkpoint (the logic behind `python -m tokenpo.evaluate`).

The model comes from `model_path`: a training run dir (its `final/` folder is evaluated), any local Hugging
Face model folder, or a hub id; a PEFT adapter folder (a LoRA run's `final/adapter/`) is applied to it with
`adapter_path`, or given alone as `model_path` when its adapter_config.json names its base model. Generation
uses the rollout engine and scoring the reward workers, in one process; problems, prompts and metrics are those
of training-time evaluation (one call: tokenpo.evaluation.run.evaluate_benchmark).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tokenpo.data import DataConfig, data_config_from_dict
from tokenpo.deepspeed import dist
from tokenpo.errors import ConfigError
from tokenpo.evaluation.benchmark import Benchmark, load_benchmark
from tokenpo.evaluation.config import EvalConfig
from tokenpo.evaluation.run import EvalResult, TextSampler, evaluate_benchmark, sample_lines
from tokenpo.models.config import ModelConfig
from tokenpo.models.loading import load_model
from tokenpo.models.lora import adapter_base, is_adapter_folder, with_adapter
from tokenpo.rewards import RewardConfig, reward_config_from_dict
from tokenpo.rewards.config import DATASET_FIELDS
from tokenpo.models.published import Published
from tokenpo.rollout import build_generator
from tokenpo.rollout.config import RolloutConfig, rollout_config_from_dict
from tokenpo.schema import from_dict

log = logging.getLogger("tokenpo")

# `org/name` as the hub spells repository ids
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# where results go when output_dir is null: under the current directory, never inside the evaluated folder
OUTPUT_ROOT = Path("outputs/eval")
SETTINGS = ("model_path", "adapter_path", "output_dir", "dtype", "attn_implementation", "trust_remote_code", "seed",
            "print_samples")
GROUPS = ("eval", "data", "reward", "rollout")


@dataclass
class EvalRun:
    """A validated stand-alone evaluation: which model, which benchmark, where the results go."""

    model: ModelConfig
    adapter: Path | None  # a PEFT adapter folder applied to the model (tokenpo.models.lora.with_adapter)
    eval: EvalConfig
    data: DataConfig
    reward: RewardConfig
    rollout: RolloutConfig
    output_dir: Path
    seed: int
    print_samples: int


def model_config_for(model_path, dtype: str, attn_implementation: str, trust_remote_code: bool) -> ModelConfig:
    """source=local for a model folder (a run dir's final/), source=hub for an `org/name` that is not a path."""
    if not model_path:
        raise ConfigError("model_path is required: a run dir (its final/ is used), a Hugging Face model folder "
                          "or a hub id, e.g. model_path=outputs/runs/<run>")
    path = Path(str(model_path)).expanduser()
    if path.exists() and is_adapter_folder(path):
        raise ConfigError(f"model_path {str(model_path)!r} is a PEFT adapter folder: pass it as adapter_path (the "
                          "base model comes from its adapter_config.json, or from model_path)")
    if path.exists():
        folder = path if (path / "config.json").is_file() else path / "final"
        if not (folder / "config.json").is_file():
            raise ConfigError(f"model_path {str(model_path)!r} is not a model folder (no config.json) "
                              "nor a run dir (no final/config.json)")
        name = path.resolve().name
        source = {"source": "local", "path": str(folder)}
    elif HUB_ID.fullmatch(str(model_path)):
        name, source = str(model_path).replace("/", "__"), {"source": "hub", "hub_id": str(model_path)}
    else:
        raise ConfigError(f"model_path {str(model_path)!r} does not exist and is not a hub id (org/name)")
    cfg = ModelConfig(name=name, dtype=dtype, attn_implementation=attn_implementation,
                      trust_remote_code=trust_remote_code, **source)
    cfg.validate()
    return cfg


def adapter_and_base(model_path, adapter_path) -> tuple[str | None, Path | None]:
    """(the base model's path, the adapter folder or None): model_path=<adapter folder> alone takes its base from the
    folder's adapter_config.json; adapter_path=<folder> applies that adapter to model_path."""
    if adapter_path is None and model_path is not None and is_adapter_folder(Path(str(model_path)).expanduser()):
        model_path, adapter_path = None, model_path
    if adapter_path is None:
        return model_path, None
    adapter = Path(str(adapter_path)).expanduser()
    if not is_adapter_folder(adapter):
        raise ConfigError(f"adapter_path {str(adapter_path)!r} is not a PEFT adapter folder (no adapter_config.json)")
    if model_path is None:
        model_path = adapter_base(adapter)
        if model_path is None:
            raise ConfigError(f"{adapter / 'adapter_config.json'} names no base model (base_model_name_or_path): pass "
                              "the base as model_path=<folder or hub id> with adapter_path")
    return str(model_path), adapter


def default_output_dir(model_path: str, model: ModelConfig, benchmark: str) -> Path:
    """outputs/eval/<model>/eval_<benchmark> under the current directory, outside the evaluated folder (which may be
    a committed run): <model> is <org>__<name> for a hub id, else <parent>__<name> of the run dir or model folder
    (a run's final/ or final/adapter named by its run dir)."""
    if model.source == "hub":
        return OUTPUT_ROOT / model.name / f"eval_{benchmark}"
    path = Path(str(model_path)).expanduser().resolve()
    while path.name in ("final", "adapter") and path.parent != path:
        path = path.parent
    return OUTPUT_ROOT / f"{path.parent.name}__{path.name}" / f"eval_{benchmark}"


def build_eval_run(tree: DictConfig | dict) -> EvalRun:
    """Validate the composed `evaluate` config; the first bad value raises ConfigError naming its key."""
    plain = OmegaConf.to_container(tree, resolve=True) if isinstance(tree, DictConfig) else dict(tree)
    plain.pop("hydra", None)
    unknown = sorted(set(plain) - set(SETTINGS) - set(GROUPS))
    if unknown:
        raise ConfigError(f"unknown top-level config keys: {', '.join(unknown)}")
    for key in ("seed", "print_samples"):
        value = plain.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{key} must be an integer >= 0, got {value!r}")
    model_path, adapter = adapter_and_base(plain.get("model_path"), plain.get("adapter_path"))
    model = model_config_for(model_path, plain["dtype"], plain["attn_implementation"], plain["trust_remote_code"])
    eval_cfg = from_dict(EvalConfig, plain["eval"], "eval")
    eval_cfg.validate()
    if eval_cfg.extra:
        raise ConfigError(f"eval.extra lists {len(eval_cfg.extra)} more benchmark(s): tokenpo.evaluate scores one; "
                          "add eval.extra=[] and evaluate each with its own eval.* settings")
    reward = reward_config_from_dict(plain["reward"])
    for name in DATASET_FIELDS:
        if getattr(reward, name) is not None:
            raise ConfigError(f"reward.{name} does not apply to evaluation (a benchmark's answers are read as its data "
                              f"config says, as in training): set eval.data.{name}, or data.{name} when eval.data "
                              "is null")
    output_dir = plain.get("output_dir")
    return EvalRun(
        model=model,
        adapter=adapter,
        eval=eval_cfg,
        data=data_config_from_dict(plain["data"]),
        reward=reward,
        rollout=rollout_config_from_dict(plain["rollout"]),
        output_dir=Path(output_dir) if output_dir else default_output_dir(str(adapter or model_path), model,
                                                                          eval_cfg.name),
        seed=plain["seed"],
        print_samples=plain["print_samples"],
    )


def load_policy(cfg: ModelConfig, adapter: Path | None = None):
    """(tokenizer, model) in eval mode on this process's device, with the PEFT adapter folder `adapter` merged in;
    a folder or hub id that cannot load is a ConfigError."""
    try:
        tokenizer, model = load_model(cfg)
    except OSError as err:
        where = cfg.path if cfg.source == "local" else cfg.hub_id
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"model_path {where!r} could not be loaded: {first_line}") from err
    if adapter is not None:
        model = with_adapter(model, adapter)
    return tokenizer, model.to(dist.device()).eval()


def run_evaluation(run: EvalRun) -> EvalResult:
    """Generate, score and summarise; writes <output_dir>/eval.json."""
    tokenizer, model = load_policy(run.model, run.adapter)
    examples, data_cfg = load_benchmark(run.eval, run.data, run.seed, tokenizer)
    log.info("evaluating %s on %s: %d problems", model_label(run), run.eval.name, len(examples))
    published = Published.of_module(model)
    with contextlib.closing(build_generator(run.rollout, tokenizer, published, dist.device())) as generator:
        generator.load(published)
        result = evaluate_benchmark(Benchmark(run.eval, examples, data_cfg), run.reward, run.rollout,
                                    TextSampler(generator.sample, tokenizer), run.seed)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    written = {"model": model_label(run), "benchmark": run.eval.name, "metrics": result.metrics,
               "records": result.records}
    (run.output_dir / "eval.json").write_text(json.dumps(written, indent=1))
    return result


def model_label(run: EvalRun) -> str:
    """The evaluated weights: the model folder or hub id, and the adapter applied to it."""
    base = run.model.path or run.model.hub_id
    return f"{base} + adapter {run.adapter}" if run.adapter else base


def metrics_table(metrics: dict) -> str:
    """A markdown table, one metric a row (counts as integers, fractions to 4 decimals)."""
    rows = ["| metric | value |", "|---|---|"]
    for key, value in metrics.items():
        shown = str(value) if isinstance(value, int) else f"{value:.4f}"
        rows.append(f"| {key} | {shown} |")
    return "\n".join(rows)


def report(run: EvalRun, result: EvalResult) -> str:
    lines = [f"## {run.eval.name}: {model_label(run)}", "", metrics_table(result.metrics)]
    if run.print_samples:
        lines += ["", "Samples (question -> response -> verdict):", *sample_lines(result.records, run.print_samples)]
    lines += ["", f"records and metrics: {run.output_dir / 'eval.json'}"]
    return "\n".join(lines)
