"""The log-prob tests' model (support/logprobs.py), fresh for each test: tests run backward through it."""

import pytest

from support.logprobs import logprob_model


@pytest.fixture
def model():
    return logprob_model()
