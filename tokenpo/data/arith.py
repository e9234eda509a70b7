"""Built-in arithmetic curriculum: seeded, exact integer answers, train and held-out eval splits disjoint.

Each level's problem space is enumerated in full; a seeded permutation of it gives the eval problems first and
the train problems after them, so the two splits can never share a problem text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache

from tokenpo.data.example import Example
from tokenpo.errors import ConfigError
from tokenpo.schema import setting

_NAMES = ("Tom", "Anna", "Ben", "Mia", "Leo", "Sara", "Omar", "Lily")
_OBJECTS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells")
# Two-step word problems (level 4): text and (result after step one, final result); both must be >= 0.
_WORD_TEMPLATES = (
    ("{n} has {a} {o} and buys {b} more, then gives away {c}. How many {o} does {n} have now?",
     lambda a, b, c: (a + b, a + b - c)),
    ("{n} has {a} {o}, gives away {b}, then gets {c} more. How many {o} does {n} have now?",
     lambda a, b, c: (a - b, a - b + c)),
    ("{n} has {a} {o}, gives {b} to a friend and loses {c}. How many {o} does {n} have left?",
     lambda a, b, c: (a - b, a - b - c)),
    ("{n} has {a} {o}, gets {b} more from a friend and buys {c} more. How many {o} does {n} have now?",
     lambda a, b, c: (a + b, a + b + c)),
)

def _add_sub(low: int, high: int) -> list[tuple[str, int]]:
    """a + b and a - b (a >= b, so results are non-negative) for a, b in [low, high]."""
    operands = range(low, high + 1)
    additions = [(f"What is {a} + {b}?", a + b) for a in operands for b in operands]
    subtractions = [(f"What is {a} - {b}?", a - b) for a in operands for b in operands if a >= b]
    return additions + subtractions


def _multiplication() -> list[tuple[str, int]]:
    """One-digit times one- or two-digit numbers, both operand orders when the second has two digits."""
    problems = [(f"What is {a} × {b}?", a * b) for a in range(1, 10) for b in range(1, 100)]
    return problems + [(f"What is {b} × {a}?", a * b) for a in range(1, 10) for b in range(10, 100)]


def _word_problems() -> list[tuple[str, int]]:
    problems = []
    for text, steps in _WORD_TEMPLATES:
        for a in range(2, 21):  # a >= 2 keeps the object noun plural
            for b in range(1, 21):
                for c in range(1, 21):
                    after_first, answer = steps(a, b, c)
                    if min(after_first, answer) < 0:
                        continue
                    index = len(problems)
                    name, noun = _NAMES[index % len(_NAMES)], _OBJECTS[(index // len(_NAMES)) % len(_OBJECTS)]
                    problems.append((text.format(n=name, a=a, b=b, c=c, o=noun), answer))
    return problems


_LEVEL_BUILDERS = {
    1: lambda: _add_sub(0, 9),
    2: lambda: _add_sub(10, 99),
    3: _multiplication,
    4: _word_problems,
}
LEVELS = tuple(_LEVEL_BUILDERS)


def answer_in_question(text: str, answer: int) -> bool:
    """True when the answer stands among the question's own numbers (`0 + 5`, `5 × 1`, `4 + 2 - 3`)."""
    return str(answer) in re.findall(r"\d+", text)


@lru_cache(maxsize=None)
def level_space(level: int) -> tuple[tuple[str, int], ...]:
    """Every (problem text, integer answer) of one level, in a fixed enumeration order.

    Problems whose answer appears among their own numbers are left out: echoing the question (the reward
    hack a 135M model finds first) must never end in the right number.
    """
    return tuple((text, answer) for text, answer in _LEVEL_BUILDERS[level]() if not answer_in_question(text, answer))


def split_counts(total: int, weights: list[float]) -> list[int]:
    """Integer counts proportional to weights summing exactly to total (largest remainder, ties to earlier levels)."""
    weight_sum = sum(weights)
    shares = [total * weight / weight_sum for weight in weights]
    counts = [int(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - shares[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass
class ArithConfig:
    """The curriculum: which levels, their sampling weights, split sizes and the seed fixing both splits."""

    levels: list[int] = setting([1, 2],
        "Difficulty levels: 1 one-digit +/-, 2 two-digit +/-, 3 one-digit x one/two-digit, 4 two-step word problems.")
    weights: list[float] = setting([0.6, 0.4], "Sampling weight of each level above (normalised), for both splits.")
    train_size: int = setting(120,
        "Number of training problems (level 1 has only 122 echo-proof problems in all, shared with eval).")
    eval_size: int = setting(64, "Number of held-out eval problems, disjoint from training.")
    seed: int = setting(0, "Seed fixing which problems land in each split (independent of the run seed).")

    def validate(self, prefix: str = "data.arith") -> None:
        if not isinstance(self.levels, list) or not self.levels:
            raise ConfigError(f"{prefix}.levels must be a non-empty list of levels {list(LEVELS)}, got {self.levels!r}")
        unknown = [level for level in self.levels if level not in LEVELS]
        if unknown or len(set(self.levels)) != len(self.levels):
            raise ConfigError(f"{prefix}.levels must be distinct levels from {list(LEVELS)}, got {self.levels!r}")
        if not isinstance(self.weights, list) or len(self.weights) != len(self.levels):
            raise ConfigError(
                f"{prefix}.weights must list one weight per level ({len(self.levels)}), got {self.weights!r}"
            )
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0 for w in self.weights):
            raise ConfigError(f"{prefix}.weights must all be > 0, got {self.weights!r}")
        for key in ("train_size", "eval_size", "seed"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{prefix}.{key} must be an integer >= 0, got {value!r}")
        train_counts = split_counts(self.train_size, self.weights)
        eval_counts = split_counts(self.eval_size, self.weights)
        for level, n_train, n_eval in zip(self.levels, train_counts, eval_counts):
            available = len(level_space(level))
            if n_train + n_eval > available:
                raise ConfigError(
                    f"{prefix}: level {level} has {available} problems but its weight asks for {n_eval} eval + "
                    f"{n_train} train; lower {prefix}.train_size/eval_size or that level's weight"
                )


def arith_splits(cfg: ArithConfig) -> tuple[list[Example], list[Example]]:
    """(train, eval) examples for the curriculum; deterministic for cfg.seed, disjoint by construction."""
    cfg.validate()
    train: list[Example] = []
    held_out: list[Example] = []
    train_counts = split_counts(cfg.train_size, cfg.weights)
    eval_counts = split_counts(cfg.eval_size, cfg.weights)
    for level, n_train, n_eval in zip(cfg.levels, train_counts, eval_counts):
        space = level_space(level)
        # A string seed is hashed deterministically (independent of PYTHONHASHSEED).
        chosen = random.Random(f"arith:{cfg.seed}:level{level}").sample(range(len(space)), n_eval + n_train)
        for position, index in enumerate(chosen):
            text, answer = space[index]
            example = Example(uid=f"arith/L{level}/{index}", problem=text, answer=str(answer), meta={"level": level})
            (held_out if position < n_eval else train).append(example)
    return train, held_out
