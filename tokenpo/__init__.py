"""tokenpo: RL fine-tuning of language models on math reasoning (GRPO, DAPO, TEPO, GTPO, GRPO-S, Dr. GRPO, GSPO)."""

__version__ = "0.1.0"
