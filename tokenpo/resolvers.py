"""OmegaConf resolvers the config tree uses; registered when tokenpo is imported, before Hydra resolves anything."""

from omegaconf import OmegaConf


def join_nonempty(separator: str, *parts: str) -> str:
    """The non-empty `parts` joined by `separator`: conf/train.yaml names a run dir `<time>_<overrides>`, and just
    `<time>` when there are no overrides (no trailing `_`)."""
    return separator.join(str(part) for part in parts if str(part))


OmegaConf.register_new_resolver("tokenpo.join", join_nonempty, replace=True)
