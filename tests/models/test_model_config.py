"""The `model` schema: a tiny model's shape is checked at start-up, not when transformers builds it."""

import pytest

from tokenpo.errors import ConfigError
from tokenpo.models.config import model_config_from_dict


@pytest.mark.parametrize(("tiny", "message"), [
    ({"num_heads": 3}, "model.tiny.num_heads=3 must split model.tiny.hidden_size=64 into heads of an even width"),
    # 60 / 4 = 15: rotary embeddings need an even head width
    ({"hidden_size": 60, "num_heads": 4}, "model.tiny.num_heads=4 must split model.tiny.hidden_size=60"),
    ({"num_layers": 0}, "model.tiny.num_layers must be >= 1, got 0"),
])
def test_tiny_shape_that_transformers_would_reject_names_the_key(tiny, message):
    with pytest.raises(ConfigError) as err:
        model_config_from_dict({"name": "tiny", "source": "tiny", "tiny": tiny})
    assert message in str(err.value)


def test_tiny_heads_of_even_width_validate():
    cfg = model_config_from_dict({"name": "tiny", "source": "tiny", "tiny": {"hidden_size": 48, "num_heads": 3}})
    assert (cfg.tiny.hidden_size, cfg.tiny.num_heads) == (48, 3)
