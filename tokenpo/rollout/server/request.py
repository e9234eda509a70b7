"""One prompt's samples from a vLLM server: token ids in, token ids out, through vLLM's tokens-in-tokens-out route
(`/inference/v1/generate`, served with --enable-scale-out), which returns each sampled token's log-prob under the
sampling distribution and the label of the weights that sampled each span of tokens (vLLM's `weight_versions`;
tokenpo labels the weights with their policy version at every push)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpo.rollout.engine import SamplingParams
from tokenpo.rollout.server.client import call

GENERATE_ROUTE = "/inference/v1/generate"
# vLLM's finish reason of a request that a pause with mode=abort dropped
ABORTED = "abort"


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]  # the policy version that sampled each token
    truncated: bool  # stopped at max_new_tokens
    aborted: bool


def request_body(prompt_ids: list[int], params: SamplingParams, seed: int) -> dict:
    """The prompt's G samples: the rollout's stop tokens exactly (EOS is among them: ignore_eos leaves no other),
    one seed (vLLM gives its G samples seed, seed + 1, ...), the sampled token's log-prob (logprobs=0)."""
    return {"token_ids": prompt_ids, "output_mode": "tokens", "sampling_params": {
        "n": params.num_samples, "temperature": params.temperature, "top_p": params.top_p,
        "max_tokens": params.max_new_tokens, "seed": seed, "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True, "logprobs": 0, "detokenize": False}}


def token_versions(spans: list[dict] | None, count: int, fallback: int) -> list[int]:
    """Each token's version from vLLM's spans ({version, start, end}); `fallback` where a span has no label."""
    versions = [fallback] * count
    for span in spans or []:
        label = span.get("version")
        for index in range(span["start"], min(span["end"], count)):
            versions[index] = int(label) if label not in (None, "") else fallback
    return versions


def samples(answer: dict, fallback_version: int) -> list[Sample]:
    """The answer's choices as samples, in their index order."""
    out = []
    for choice in sorted(answer["choices"], key=lambda choice: choice["index"]):
        tokens = list(choice.get("token_ids") or [])
        content = (choice.get("logprobs") or {}).get("content") or []
        out.append(Sample(tokens, [entry["logprob"] for entry in content],
                          token_versions(choice.get("weight_versions"), len(tokens), fallback_version),
                          choice.get("finish_reason") == "length", choice.get("finish_reason") == ABORTED))
    return out


def generate(url: str, prompt_ids: list[int], params: SamplingParams, seed: int, timeout_s: float,
             version: int) -> list[Sample]:
    """The prompt's samples from the server at `url`, which holds `version` when the request starts."""
    return samples(call(url, GENERATE_ROUTE, request_body(prompt_ids, params, seed), timeout_s=timeout_s), version)
