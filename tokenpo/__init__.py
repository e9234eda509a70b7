"""tokenpo: RL fine-tuning of language models on math reasoning (GRPO, DAPO, TEPO, GTPO, GRPO-S, Dr. GRPO, GSPO)."""

from pathlib import Path

from tokenpo import resolvers  # noqa: F401  (registers ${tokenpo.join:...}, used by conf/train.yaml)

# The Hydra config tree every entry point and test composes from: the package resource tokenpo/conf, in a wheel a
# folder of the installed package, in a checkout a link to the repository's conf/ (pyproject.toml ships its YAML).
CONF_DIR = str(Path(__file__).resolve().parent / "conf")

__version__ = "0.1.0"
