"""What one benchmark measures, and the tokenpo config and prompts both frameworks get from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tokenpo.errors import ConfigError

MODELS = ("smollm2_135m", "tiny")
ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class BenchSettings:
    model: str = "smollm2_135m"
    prompts: int = 8
    group_size: int = 4
    max_new_tokens: int = 32
    beta: float = 0.04
    lr: float = 1e-5
    # sequences per forward/backward pass in both frameworks (tokenpo trainer.micro_batch_size, TRL
    # per_device_train_batch_size with gradient accumulation up to prompts x G: still one update per step)
    micro_batch_size: int = 32
    # RL steps per framework run; the first is warm-up and is not counted
    steps: int = 4
    threads: int = 2
    seed: int = 0
    # tokenpo's rollout engine (rollout=<engine>); vllm needs the environment of scripts/setup_vllm.sh
    engine: str = "hf"
    # extra tokenpo Hydra overrides (key=value), e.g. rollout.share_prefill=false; TRL ignores them
    overrides: tuple[str, ...] = field(default_factory=tuple)

    def validate(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"bench --model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.engine not in ENGINES:
            raise ConfigError(f"bench --engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        for key in ("prompts", "max_new_tokens", "threads"):
            if getattr(self, key) < 1:
                raise ConfigError(f"bench --{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")
        # TRL's GRPO refuses groups of one (no group advantage)
        if self.group_size < 2:
            raise ConfigError(f"bench --group-size must be >= 2, got {self.group_size}")
        rows, per_pass = self.prompts * self.group_size, self.sequences_per_pass
        if per_pass % self.group_size or rows % per_pass:
            raise ConfigError(f"bench --micro-batch-size must be a multiple of --group-size={self.group_size} that "
                              f"divides prompts x group size = {rows} (or >= it), got {self.micro_batch_size}")
        if self.steps < 2:
            raise ConfigError(f"bench --steps must be >= 2 (the first step is warm-up), got {self.steps}")
        if self.beta < 0 or not self.lr > 0:
            raise ConfigError(f"bench --beta must be >= 0 and --lr > 0, got {self.beta}, {self.lr}")
        bad = [o for o in self.overrides if "=" not in o]
        if bad:
            raise ConfigError(f"bench --override takes key=value, got {bad[0]!r}")

    @property
    def sequences_per_pass(self) -> int:
        """Sequences per forward/backward pass: the micro-batch, at most one step's prompts x G."""
        return min(self.micro_batch_size, self.prompts * self.group_size)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["overrides"] = list(self.overrides)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "BenchSettings":
        return cls(**{**data, "overrides": tuple(data.get("overrides", ()))})


def hydra_overrides(s: BenchSettings) -> list[str]:
    """The training run a bench step is: GRPO at the given shape, no W&B, no held-out evaluation."""
    return [
        f"model={s.model}",
        f"rollout={s.engine}",
        f"seed={s.seed}",
        f"data.prompts_per_step={s.prompts}",
        # no eval split -> the trainer evaluates nothing before, during or after training
        "data.eval_split=null",
        f"rollout.group_size={s.group_size}",
        f"rollout.max_new_tokens={s.max_new_tokens}",
        f"algorithm.loss.kl_coef={s.beta}",
        f"trainer.lr={s.lr}",
        # TRL's run has a constant learning rate from the first step
        "trainer.warmup_steps=0",
        "trainer.lr_schedule=constant",
        f"trainer.max_steps={s.steps}",
        f"trainer.micro_batch_size={s.sequences_per_pass}",
        f"trainer.threads={s.threads}",
        "trainer.print_samples=0",
        "trainer.save_every=0",
        "trainer.resume=none",
        "logger.mode=disabled",
        *s.overrides,
    ]


def compose_tree(s: BenchSettings):
    """The Hydra tree `python -m tokenpo.train <overrides>` would build, from tokenpo's config tree."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tokenpo import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="tokenpo_bench"):
        try:
            return compose(config_name="train", overrides=hydra_overrides(s))
        except (HydraException, OmegaConfBaseException) as err:
            raise ConfigError(f"bench: the tokenpo config does not compose: {str(err).splitlines()[0]}") from None


def train_config(s: BenchSettings):
    """(validated TrainConfig, resolved plain dict) for these settings."""
    from omegaconf import OmegaConf

    from tokenpo.config import build_config

    tree = compose_tree(s)
    return build_config(tree), OmegaConf.to_container(tree, resolve=True)


def step_examples(cfg, steps: int) -> list:
    """The prompts of steps 1..steps, in the order tokenpo's trainer samples them (same data, seed, sampler)."""
    from tokenpo.data import PromptSampler, load_splits

    train_examples, _ = load_splits(cfg.data, cfg.seed)
    sampler = PromptSampler(train_examples, cfg.data.prompts_per_step, cfg.seed)
    return [sampler.next_batch() for _ in range(steps)]
