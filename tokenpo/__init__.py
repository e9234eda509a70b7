"""tokenpo: RL fine-tuning of language models on math reasoning (GRPO, DAPO, TEPO, GTPO, GRPO-S, Dr. GRPO, GSPO)."""

from tokenpo import resolvers  # noqa: F401  (registers ${tokenpo.join:...}, used by conf/train.yaml)

__version__ = "0.1.0"
