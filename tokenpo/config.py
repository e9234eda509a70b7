"""The whole run's typed config, built from Hydra's composed tree and validated at start-up."""

from __future__ import annotations

from dataclasses import dataclass, replace

from omegaconf import DictConfig, OmegaConf

from tokenpo.algorithms.config import AlgorithmConfig, algorithm_config_from_dict
from tokenpo.algorithms.inert import inert_on_policy, needs_group
from tokenpo.data.config import DataConfig, data_config_from_dict, data_keys_under
from tokenpo.deepspeed.config import DeepSpeedConfig, check_precision
from tokenpo.evaluation.config import EvalConfig, data_keys
from tokenpo.evaluation.judging import data_reward_defaults
from tokenpo.logger.config import LoggerConfig
from tokenpo.models.config import ModelConfig, model_config_from_dict
from tokenpo.rewards.config import RewardConfig, resolve, reward_config_from_dict
from tokenpo.rollout.config import RolloutConfig, require_sampler_logprobs, rollout_config_from_dict
from tokenpo.schema import build, must_be, require
from tokenpo.trainer.config import TrainerConfig

GROUPS = ("algorithm", "model", "data", "reward", "rollout", "deepspeed", "logger", "eval", "trainer")


@dataclass
class TrainConfig:
    seed: int
    algorithm: AlgorithmConfig
    model: ModelConfig
    data: DataConfig
    reward: RewardConfig
    rollout: RolloutConfig
    deepspeed: DeepSpeedConfig
    logger: LoggerConfig
    eval: EvalConfig
    trainer: TrainerConfig

    def reward_for(self, data: DataConfig) -> RewardConfig:
        """The training reward for a dataset: explicit reward.* values win, nulls take the dataset's.

        Benchmarks are judged by benchmark_reward instead, in training-time eval and `tokenpo.evaluate` alike.
        """
        return resolve(self.reward, data_reward_defaults(data))

    @property
    def ratios_are_one(self) -> bool:
        """Whether every importance ratio the loss reads is exactly 1: one update per rollout, generated in turn (or
        ahead under the decoupled objective, whose ratio is to the policy at the update's start)."""
        ahead = self.rollout.async_
        return self.trainer.mini_batches == 1 and (ahead.max_staleness == 0 or ahead.decoupled)

    def inert_components(self) -> str | None:
        """One line naming the algorithm's settings that cannot act under this run's settings and the key that makes
        them act (None when every one can)."""
        if not self.ratios_are_one:
            return None
        inert = inert_on_policy(self.algorithm)
        if not inert:
            return None
        return (f"{', '.join(inert)}: inert here, since with trainer.mini_batches=1 the policy trained is the policy "
                "that sampled and every importance ratio is 1; trainer.mini_batches=2 (or more) makes them act "
                "(docs/experiments.md)")

    def validate_batch(self, world_size: int) -> None:
        """The step's groups must split evenly over ranks and mini-batches (one-line error naming the numbers)."""
        groups = self.data.prompts_per_step
        parts = world_size * self.trainer.mini_batches
        require(groups % parts == 0,
                f"data.prompts_per_step={groups} does not divide across {world_size} process(es) x "
                f"trainer.mini_batches={self.trainer.mini_batches}; use a multiple of {parts}")


def build_config(tree: DictConfig | dict) -> TrainConfig:
    """Validate every group; the first bad value raises ConfigError with a one-line message naming its key."""
    plain = OmegaConf.to_container(tree, resolve=True) if isinstance(tree, DictConfig) else dict(tree)
    missing = [g for g in GROUPS if g not in plain]
    require(not missing, f"config lacks the group(s): {', '.join(missing)}")
    unknown = sorted(set(plain) - set(GROUPS) - {"seed", "hydra"})
    require(not unknown, f"unknown top-level config keys: {', '.join(unknown)}")
    seed = plain.get("seed", 0)
    require(isinstance(seed, int) and seed >= 0, must_be("seed", "a non-negative integer", seed))
    data = data_config_from_dict(plain["data"])
    extras = plain["eval"].get("extra") or []
    for key, benchmark in zip(data_keys(extras), [plain["eval"], *extras]):
        if isinstance(benchmark, dict) and benchmark.get("data") is not None:
            with data_keys_under(key):
                data_config_from_dict(benchmark["data"])  # a benchmark's data config fails here, not mid-run
    config = TrainConfig(
        seed=seed,
        algorithm=algorithm_config_from_dict(plain["algorithm"]),
        model=model_config_from_dict(plain["model"]),
        data=data,
        reward=reward_config_from_dict(plain["reward"]),
        rollout=rollout_config_from_dict(plain["rollout"]),
        deepspeed=with_precision(build(DeepSpeedConfig, plain["deepspeed"], "deepspeed"), plain["model"]),
        logger=build(LoggerConfig, plain["logger"], "logger"),
        eval=build(EvalConfig, plain["eval"], "eval"),
        trainer=build(TrainerConfig, plain["trainer"], "trainer"),
    )
    require_sampler_logprobs(config.algorithm.loss.tis_cap, config.rollout)
    check_precision(config.model.dtype, config.deepspeed.precision)
    check_group_size(config.algorithm, config.rollout.group_size)
    return config


def check_group_size(algorithm: AlgorithmConfig, group_size: int) -> None:
    """One response per prompt where the advantage or dynamic sampling compares the responses to a prompt: refused,
    naming the setting (nothing would train, or no group would ever be kept)."""
    if group_size > 1:
        return
    setting = needs_group(algorithm)
    require(setting is None, f"rollout.group_size=1 with {setting}, which compares each response with the other "
                             "responses to its prompt: every advantage would be 0 and nothing would train; use "
                             "rollout.group_size >= 2")
    require(not algorithm.dynamic_sampling.enabled,
            "rollout.group_size=1 with algorithm.dynamic_sampling.enabled=true, which keeps only groups with both "
            "right and wrong answers, and one response per prompt never has both; use rollout.group_size >= 2 or "
            "algorithm.dynamic_sampling.enabled=false")


def with_precision(deepspeed: DeepSpeedConfig, model: dict) -> DeepSpeedConfig:
    """deepspeed.precision=auto resolved from the model's dtype: bf16 (fp32 master weights) for bfloat16 weights, fp32
    otherwise; an explicit value stays (a bf16 model with fp32 is refused by check_precision)."""
    if deepspeed.precision != "auto":
        return deepspeed
    return replace(deepspeed, precision="bf16" if model.get("dtype") == "bfloat16" else "fp32")


