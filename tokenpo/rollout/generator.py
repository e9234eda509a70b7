"""The one interface between training and generation: a `Generator` samples rollouts for a version of the policy that
`Policy.publish` handed it, and the trainer talks to nothing else.

- `Published` (tokenpo.models.published): a version of the policy's weights as it leaves the policy
  (`Policy.publish`), the only way it does.
- `GenerateRequest` / `Generated`: prompts, sampling parameters, a seed, and the version that must sample them; the
  responses with the version that did and what it waited for.
- `Generator`: load a published version, take requests (answered now or in the background), sample now with the
  version it holds (evaluation), sleep and wake, its own checkpoint state, close. `AnsweredNow` gives a generator in
  the trainer's process (the `hf` and `vllm` engines) its request half.

Which version samples which step is `version_for`, a pure function of the step and the bound on staleness.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:  # the protocol imports neither torch nor the models: start-up checks read the rollout config first
    import torch

    from tokenpo.models.published import Published
    from tokenpo.rollout.engine import Responses, SamplingParams


T = TypeVar("T")


@dataclass(frozen=True)
class GenerateRequest:
    key: tuple[int, int]  # (step, dynamic-sampling round) it is drawn for
    prompt_ids: list[list[int]]
    params: SamplingParams
    seed: int  # the sampling generator's seed
    version: int  # the policy version that samples it


@dataclass(frozen=True)
class Generated:
    key: tuple[int, int]
    responses: Responses
    version: int  # the version that sampled it (a partial rollout's oldest: its staleness is its oldest token's)
    weights_wait_s: float  # the generator waited this long for the version's weights
    generate_s: float


class GeneratorDown(RuntimeError):
    """The generator's process or servers died or stopped answering (one line naming which): the run saves what it
    can and stops (tokenpo.trainer.harness.loop)."""


def agreed(action: Callable[..., T], *args) -> T:
    """`action(*args)`, called by every rank: a `GeneratorDown` on one rank is one on every rank (the lowest failing
    rank's line), so that no rank goes on into the step's collectives while another saves and stops (they would
    wait for each other until the process group's timeout)."""
    from tokenpo.deepspeed import dist

    failure, result = None, None
    try:
        result = action(*args)
    except GeneratorDown as error:
        failure = str(error)
    failures = [line for line in dist.all_gather_objects(failure) if line is not None]
    if failures:
        raise GeneratorDown(failures[0])
    return result


def results_state(done: dict[tuple[int, int], Generated]) -> dict:
    """Results waited for, as a checkpoint keeps them (plain data)."""
    return {"results": [{**asdict(generated), "key": list(key)} for key, generated in sorted(done.items())]}


def restored_results(state: dict) -> dict[tuple[int, int], Generated]:
    """`results_state`'s results back."""
    from tokenpo.rollout.engine import Responses

    restored = {}
    for item in state.get("results", []):
        key = tuple(item["key"])
        restored[key] = Generated(key, Responses(**item["responses"]), item["version"], 0.0, 0.0)
    return restored


def version_for(step: int, max_staleness: int) -> int:
    """The policy version that samples step `step`'s first round: at most `max_staleness` versions behind the
    version step `step` trains (step - 1)."""
    return max(0, step - 1 - max_staleness)


class Generator(Protocol):
    """What samples rollouts for the trainer (tokenpo.rollout.ENGINES builds one per run)."""

    def load(self, published: Published) -> None:
        """Hold version `published.version` from now on (its weights copied in, or read in place); wakes a sleeping
        generator. Every rank calls it (under ZeRO-3 reading the tensors is a collective)."""

    def submit(self, request: GenerateRequest) -> None:
        """Sample `request` with the version it names: now, or in the background for a generator that runs ahead."""

    def result(self, key: tuple[int, int]) -> tuple[Generated, float]:
        """(the submitted request `key`'s result, the seconds the caller waited for it)."""

    def sample(self, prompt_ids: list[list[int]], params: SamplingParams, rng: torch.Generator) -> Responses:
        """Responses now, from the version held, every random draw from `rng` (held-out evaluation)."""

    def sleep(self) -> None:
        """Release what memory it can for a pass that trains; the next `load` wakes it."""

    def wake_up(self) -> None:
        """Take back what `sleep` released, if the weights were kept."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of it: the requests in flight, waited for, with their results (plain data)."""

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state back (before the first `load`)."""

    def take_metrics(self) -> dict[str, float]:
        """What it measured since the last call (waits, staleness), as step metrics."""

    def close(self) -> None:
        """Stop for good: no process or server it started outlives it."""


class AnsweredNow:
    """The request half of a generator in the trainer's process: a request is sampled when it is submitted, by the
    version loaded (which must be the one it names), from a generator seeded with its seed on `self.device`. The
    class using it defines `sample` and sets `published`, `device` and `answers` (a dict)."""

    published: Published
    device: torch.device
    answers: dict

    def submit(self, request: GenerateRequest) -> None:
        from tokenpo.rollout.engine import Responses, seeded_generator

        if request.version != self.published.version:
            raise RuntimeError(f"rollout engine: request {request.key} needs policy version {request.version}, the "
                               f"engine holds {self.published.version}")
        started = time.perf_counter()
        # a rank without groups in this round samples nothing (rounds split evenly over the ranks: not in a run)
        out = (self.sample(request.prompt_ids, request.params, seeded_generator(request.seed, self.device))
               if request.prompt_ids else Responses([], []))
        self.answers[request.key] = Generated(request.key, out, request.version, 0.0, time.perf_counter() - started)

    def result(self, key: tuple[int, int]) -> tuple[Generated, float]:
        return self.answers.pop(key), 0.0

    def state_dict(self) -> dict:
        return {}  # nothing in flight: a request is answered when submitted

    def load_state_dict(self, state: dict) -> None:
        pass

    def take_metrics(self) -> dict[str, float]:
        return {}
