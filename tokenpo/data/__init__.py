"""Data: the built-in arithmetic curriculum, dataset loaders, prompt templates and the training prompt sampler."""

from tokenpo.data.arith import ArithConfig, arith_splits
from tokenpo.data.config import DataConfig, data_config_from_dict
from tokenpo.data.example import Example, LoadReport
from tokenpo.data.loaders import LOADERS, load_split, load_splits
from tokenpo.data.prompts import PromptTemplate, build_prompt, describe_template
from tokenpo.data.sampler import PromptSampler

__all__ = [
    "LOADERS",
    "ArithConfig",
    "DataConfig",
    "Example",
    "LoadReport",
    "PromptSampler",
    "PromptTemplate",
    "arith_splits",
    "build_prompt",
    "data_config_from_dict",
    "describe_template",
    "load_split",
    "load_splits",
]
