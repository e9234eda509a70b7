"""Typed schema of the `trainer` config group."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.deepspeed.config import COLLECTIVE_TIMEOUT_S
from tokenpo.schema import check_fields, require, section, setting

LR_SCHEDULES = ("constant", "cosine", "linear")
VERIFY_CHECKPOINTS = ("full", "sizes")
# what a health detector does when it fires (tokenpo.trainer.harness.health; docs/reliability.md)
HEALTH_ACTIONS = ("warn", "skip", "stop")
HEALTH_ACTION_HELP = ("What it does when it fires: warn (one log line, and a W&B alert when W&B is on) | skip (also "
                      "leaves this step's last optimizer update unapplied, counted in health/skipped_updates) | stop "
                      "(as skip, then saves a checkpoint and ends the run with a one-line error)")


@dataclass
class ConstantRewardCheck:
    action: str = setting("warn", HEALTH_ACTION_HELP, choices=HEALTH_ACTIONS)
    steps: int | None = setting(5,
        "Steps in a row in which every response got the same verdict (reward/correct_frac 0 or 1: a broken verifier "
        "pays the same to all) before it fires (null = off)", ge=1, requirement=">= 1 or null")


@dataclass
class NonFiniteCheck:
    action: str = setting("skip",
        "A non-finite loss or gradient is never applied to the weights, whatever this says: skip (count it in "
        "health/skipped_updates and go on) | stop (also save a checkpoint and end the run)", choices=("skip", "stop"))


@dataclass
class RatioCheck:
    action: str = setting("warn", HEALTH_ACTION_HELP, choices=HEALTH_ACTIONS)
    max_kl_old: float | None = setting(0.1,
        "Bound on kl/old, the k3 KL of the updated policy to the rollout policy per token (0 with one mini-batch; "
        "0.1 is a log-ratio near 0.45 on the average token, far outside a 0.2 clip range) (null = off)",
        ge=0, finite=True, requirement="a finite number >= 0 or null")
    steps: int = setting(1, "Steps in a row past the bound before it fires", ge=1)


@dataclass
class SamplerKLCheck:
    action: str = setting("warn", HEALTH_ACTION_HELP, choices=HEALTH_ACTIONS)
    max_kl: float | None = setting(0.01,
        "Bound on mismatch/kl, the rollout engine's KL to the trainer's rollout policy on the sampled tokens (only "
        "where the engine returns log-probs, rollout=vllm; a stale weight sync shows here) (null = off)",
        ge=0, finite=True, requirement="a finite number >= 0 or null")
    steps: int = setting(1, "Steps in a row past the bound before it fires", ge=1)


@dataclass
class RewardErrorsCheck:
    action: str = setting("stop",
        "What it does when it fires: warn (one log line, and a W&B alert when W&B is on) | stop (saves a checkpoint "
        "and ends the run with a one-line error and a non-zero exit status)", choices=("warn", "stop"))
    max_error_frac: float | None = setting(0.99,
        "Bound on reward/error_frac, the step's responses whose reward function raised or returned a wrong type (or "
        "whose scoring worker died): above it every reward is an error and nothing is learned (null = off)",
        ge=0, lt=1, requirement="in [0, 1) or null")
    steps: int = setting(2, "Steps in a row past the bound before it fires", ge=1)


@dataclass
class EntropyCheck:
    action: str = setting("warn", HEALTH_ACTION_HELP, choices=HEALTH_ACTIONS)
    reference_steps: int = setting(3,
        "The run's first steps whose mean entropy/mean is the reference the bounds scale (kept in checkpoints)", ge=1)
    collapse_frac: float | None = setting(0.01,
        "Fires below this fraction of the reference (the main job's lowest step is at 2.3 % of its start, the CPU "
        "study's GTPO at 1.4 % by step 30: a fall of 10-40x is normal on arithmetic) (null = off)",
        gt=0, lt=1, requirement="in (0, 1) or null")
    blowup_factor: float | None = setting(3.0,
        "Fires above this multiple of the reference (null = off)", gt=1, finite=True,
        requirement="a finite number > 1 or null")
    steps: int = setting(3, "Steps in a row past a bound before it fires (one step's entropy is noisy)", ge=1)


DETECTORS = ("constant_reward", "nonfinite", "ratio", "sampler_kl", "entropy", "reward_errors")
# detectors that never hold the step's last update: nonfinite (UpdateGuard refuses such an update itself) and
# reward_errors (warn or stop only)
UNHELD = ("nonfinite", "reward_errors")


@dataclass
class HealthConfig:
    constant_reward: ConstantRewardCheck = section(ConstantRewardCheck,
        "Every reward 0 (or every reward 1) for several steps in a row")
    nonfinite: NonFiniteCheck = section(NonFiniteCheck, "A non-finite loss or gradient norm")
    ratio: RatioCheck = section(RatioCheck, "The update's importance ratios to the rollout policy")
    sampler_kl: SamplerKLCheck = section(SamplerKLCheck, "Sampler/trainer mismatch")
    entropy: EntropyCheck = section(EntropyCheck, "Entropy collapse or blow-up against the run's own start")
    reward_errors: RewardErrorsCheck = section(RewardErrorsCheck,
        "Rewards that are all errors (a broken reward function) for several steps in a row")

    def validate(self) -> None:
        for name in DETECTORS:
            check_fields(getattr(self, name), f"trainer.health.{name}")

    @property
    def holds_updates(self) -> bool:
        """Whether each step's last update waits for the step's checks: a detector that may skip or stop it."""
        return any(getattr(self, name).action in ("skip", "stop") for name in DETECTORS if name not in UNHELD)


@dataclass
class TrainerConfig:
    max_steps: int = setting(30, "Training steps (one step = sample prompts, generate, reward, update)", ge=1)
    lr: float = setting(2e-5, "Peak learning rate of AdamW (paper scale: 1e-6; the 135M CPU demo learns at 2e-5..5e-5)",
        gt=0)
    warmup_steps: int = setting(2,
        "Linear warm-up in rollout steps before the peak learning rate; every mini-batch update of rollout step k uses "
        "lr(k) (DAPO Sec. 4.1: 20 rollout steps)", ge=0)
    lr_schedule: str = setting("constant",
        "Learning-rate schedule after warm-up, over rollout steps (decay reaches 0 at max_steps): constant | cosine | "
        "linear", choices=LR_SCHEDULES)
    weight_decay: float = setting(0.0, "AdamW weight decay (verl/DAPO: 0.1; 0 keeps short runs simple)", ge=0)
    adam_betas: tuple = setting((0.9, 0.999), "AdamW betas")
    max_grad_norm: float = setting(1.0, "Gradient-norm clipping threshold (DAPO/verl: 1.0)", ge=0)
    mini_batches: int = setting(1,
        "Policy updates per rollout batch (1 = on-policy: old log-probs are the current ones, no extra pass; DAPO "
        "paper: 16)", ge=1)
    micro_batch_size: int = setting(32,
        "Sequences per forward/backward pass on one process (memory knob; the result does not depend on it): whole "
        "groups at >= rollout.group_size, below it a slice of one group's rows (down to 1, as verl's "
        "ppo_micro_batch_size_per_gpu)", ge=1)
    micro_batch_tokens: int | None = setting(None,
        "Tokens per forward/backward pass on one process (null = by micro_batch_size): padded passes count rows x "
        "their longest prompt + response, packed ones their own tokens; a group's rows free to land in different "
        "passes, the same update (verl's use_dynamic_bsz + ppo_max_token_len_per_gpu); at least the longest prompt + "
        "rollout.max_new_tokens",
        ge=1, requirement=">= 1 or null")
    pack_sequences: bool = setting(False,
        "Run each pass as one padding-free sequence (verl's use_remove_padding): under sdpa each prompt once with its "
        "rows' responses attending to it, under flash-attention or eager each row with its prompt, positions "
        "restarting")
    balance_ranks: str = setting("tokens",
        "How the update's groups go to processes: tokens (longest first to the least-loaded process, equal counts, "
        "so no process waits long for one that drew the long answers) | round_robin (group i to process i mod N)",
        choices=("tokens", "round_robin"))
    nproc: int = setting(1,
        "Local worker processes this job starts itself (1 = none; >1 runs DeepSpeed over gloo/NCCL on this machine)",
        ge=1)
    dist_timeout_s: float = setting(COLLECTIVE_TIMEOUT_S,
        "Seconds a collective (all-reduce, broadcast, barrier) waits for the slowest process before the run fails; a "
        "DAPO round of 20k-token generations or rank 0 hashing a large checkpoint can outlast DeepSpeed's 10 min "
        "default (verl: nccl_timeout 600, raised for long rollouts; ReaLHF: 7200 s, as generation can exceed an hour)",
        gt=0)
    save_every: int = setting(0,
        "Save a resumable checkpoint every this many steps (0 = never; the final policy is still exported to final/)",
        ge=0)
    keep_last: int = setting(2,
        "Resumable checkpoints kept on disk: the one just saved and the newest earlier ones by step (older ones are "
        "deleted)", ge=1)
    resume: str = setting("auto",
        "Resume: auto (newest checkpoint in this run dir that verifies, if any) | none | <path to a checkpoint or run "
        "dir>")
    verify_checkpoints: str = setting("full",
        "Checkpoint integrity: full (each process records, and on resume checks, the crc32 of the files it wrote; every"
        " file's size too) | sizes (presence and sizes only: for checkpoints too large to read back at each save; "
        "docs/reliability.md)", choices=VERIFY_CHECKPOINTS)
    threads: int = setting(0, "Intra-op CPU threads per process (0 = torch's default)", ge=0)
    logit_chunk_tokens: int = setting(1024,
        "Response tokens per output-layer chunk when computing log-probs and entropy (bounds vocab-sized memory)", ge=1)
    recompute_head: bool = setting(False,
        "Recompute each output-layer chunk in backward instead of storing its logits (for 150k vocabularies on GPU)")
    memory_limit: int | str | None = setting(None,
        "Memory one process may use (bytes, or e.g. 80GiB); start-up refuses a run whose memory plan (python -m "
        "tokenpo.plan) exceeds it (null: the CUDA device's memory; no limit on CPU)")
    worst_case_first: bool | None = setting(None,
        "One forward + backward at the largest shapes before step 1 (no optimizer step, no RNG use), so a run that will"
        " not fit fails in its first minute (null: on with CUDA, off on CPU)")
    print_samples: int = setting(4, "Sample question -> response -> verdict lines printed before and after training",
        ge=0)
    objective: str | None = setting("eval/accuracy",
        "Metric whose value at the last step a job returns to its sweeper (Optuna's objective; docs/cluster.md): an "
        "eval metric, e.g. eval/accuracy, eval/<benchmark>/pass@1 (null = return nothing)")
    health: HealthConfig = section(HealthConfig,
        "Runs that watch themselves: per-step detectors, each with an action (docs/reliability.md)")

    def validate(self) -> None:
        check_fields(self, "trainer")
        self.health.validate()
        if self.memory_limit is not None:
            from tokenpo.plan.units import parse_bytes

            parse_bytes(self.memory_limit, "trainer.memory_limit")
        require(len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
                f"trainer.adam_betas must be two numbers in [0, 1), got {list(self.adam_betas)}")
