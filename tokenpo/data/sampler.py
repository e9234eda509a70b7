"""Training prompt order: epoch by epoch, reshuffled each epoch, resumable at the exact data position."""

from __future__ import annotations

import random

from tokenpo.data.example import Example
from tokenpo.errors import ConfigError

_STATE_KEYS = ("epoch", "position", "seed", "num_examples")


class PromptSampler:
    """Yields batches of `batch_size` examples (data.prompts_per_step).

    A batch that reaches the end of an epoch continues in the next epoch's order, so every batch is full and every
    example is drawn once per epoch. The order of epoch e depends only on (seed, e), so `state_dict()` (epoch,
    position, seed) is all a resumed run needs.
    """

    def __init__(self, examples: list[Example], batch_size: int, seed: int):
        if not examples:
            raise ConfigError("data: the training split is empty, nothing to sample prompts from")
        if batch_size > len(examples):
            raise ConfigError(
                f"data.prompts_per_step ({batch_size}) exceeds the {len(examples)} training examples"
            )
        self.examples = examples
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: list[int] = []

    def _epoch_order(self) -> list[int]:
        if self._order_epoch != self.epoch:
            order = list(range(len(self.examples)))
            # A string seed hashes deterministically, independent of PYTHONHASHSEED.
            random.Random(f"prompt-sampler:{self.seed}:{self.epoch}").shuffle(order)
            self._order, self._order_epoch = order, self.epoch
        return self._order

    def next_batch(self, size: int | None = None) -> list[Example]:
        """The next `size` examples (default batch_size; dynamic sampling draws more per generation round)."""
        size = self.batch_size if size is None else size
        batch: list[Example] = []
        while len(batch) < size:
            order = self._epoch_order()
            take = min(size - len(batch), len(order) - self.position)
            batch.extend(self.examples[i] for i in order[self.position : self.position + take])
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return batch

    def __iter__(self):
        return self

    def __next__(self) -> list[Example]:
        return self.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_examples": len(self.examples)}

    def load_state_dict(self, state: dict) -> None:
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ConfigError(f"prompt sampler state lacks {', '.join(missing)} (has: {', '.join(state)})")
        if state["num_examples"] != len(self.examples):
            raise ConfigError(
                f"prompt sampler state was saved for {state['num_examples']} training examples, the data now has "
                f"{len(self.examples)}; resume with the same data config"
            )
        if not 0 <= state["position"] < len(self.examples):
            raise ConfigError(f"prompt sampler state position {state['position']} is out of range")
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]
