"""Every metric a run logs (metrics.jsonl, W&B): its key, what it is, over which rows, and when it is logged.

One place: docs/metrics.md is generated from `METRICS` (`python -m tokenpo.metrics_registry > docs/metrics.md`;
tests/test_metrics_registry.py checks the page is current) and the tests hold the registry against every key tiny runs
log: a key no entry matches, or an entry whose rule says "logged" (or "not logged") for a run that disagrees, fails
them. A key may hold `<name>` placeholders (`eval/<bench>/pass@<k>`).

Words the definitions use:
- *drawn responses*: every response the step generated, over all of dynamic sampling's rounds, kept or filtered out;
- *the trained batch*: the step's groups after dynamic sampling's filter (every drawn group when it is off), with
  `data.prompts_per_step` groups of `rollout.group_size` responses;
- *shaped*: after the algorithm's reward values and shaping (DAPO's −1 for a wrong answer and its overlong
  punishment, GTPO's GROP, the format bonus): not comparable across algorithms. `accuracy/drawn` is the unshaped,
  unfiltered correctness that is.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# when a metric appears: in every training step's record (steps >= 1), in every record (step 0 included), or in the
# records of evaluation steps (before training at step 0, every eval.every_steps, the last step)
STEP, EVERY, EVAL = "step", "every", "eval"

# the run's TrainConfig -> logged (True), not logged (False), depends on the step (None)
Rule = Callable[[Any], "bool | None"]
# what each <name> of a key stands for
PLACEHOLDERS = {"<bench>": r"[^/]+", "<polarity>": "(pos|neg)", "<k>": r"\d+", "<n>": r"\d+", "<lag>": r"\d+",
                "<detector>": r"[a-z_]+", "<verdict>": r"[a-z_]+"}


@dataclass(frozen=True)
class Metric:
    key: str  # the logged key, or a pattern with <name> placeholders
    definition: str
    rows: str  # over which responses, tokens or runs it is computed
    when: str  # when it is logged, in words
    kind: str = STEP
    logged: Rule | None = None  # None: always, in the records of its kind

    @property
    def pattern(self) -> re.Pattern:
        return re.compile("".join(PLACEHOLDERS[part] if part.startswith("<") else re.escape(part)
                                  for part in re.split(r"(<[a-z_]+>)", self.key)) + r"\Z")

    def rule(self, cfg: Any) -> bool | None:
        return True if self.logged is None else self.logged(cfg)


def _surrogate(*names: str) -> Rule:
    return lambda cfg: cfg.algorithm.loss.surrogate in names


def _dynamic_sampling(cfg) -> bool:
    return cfg.algorithm.dynamic_sampling.enabled


def _reference(cfg) -> bool:
    from tokenpo.algorithms.config import needs_reference

    return needs_reference(cfg.algorithm)


def _old_pass(cfg) -> bool | None:
    """The no-grad pass of the old policy (StepSettings.needs_old_logprobs); rollouts ahead of the update: depends."""
    from tokenpo.algorithms.config import needs_entropy, needs_step_logprobs

    if cfg.rollout.async_.max_staleness:
        return None
    return cfg.trainer.mini_batches > 1 or needs_entropy(cfg.algorithm) or needs_step_logprobs(cfg.algorithm)


def _ahead(cfg) -> bool:
    return cfg.rollout.async_.max_staleness > 0


def _sampler_logprobs(cfg) -> bool | None:
    """The engine's own log-probs reach the loss: vLLM's, or a generator's ahead of the update (depends then)."""
    from tokenpo.rollout.engine import ENGINES

    return None if ENGINES.trait(cfg.rollout.engine, "logprobs") or _ahead(cfg) else False


def _servers(cfg) -> bool:
    """The engine generates on servers of its own, and pushes the weights to them."""
    from tokenpo.rollout.engine import ENGINES

    return bool(ENGINES.trait(cfg.rollout.engine, "servers"))


def _tis(cfg) -> bool | None:
    return False if cfg.algorithm.loss.tis_cap is None else _sampler_logprobs(cfg)


def _entropy_top(cfg) -> bool:
    return cfg.algorithm.loss.entropy_top_frac is not None


def _entropy_bonus(cfg) -> bool | None:
    loss = cfg.algorithm.loss
    return None if loss.entropy_control == "adaptive" else loss.entropy_coef != 0


def _depends(cfg) -> None:
    return None


CLIPPED = _surrogate("clipped", "clip_cov")
TRAINED = "the trained batch"
TOKENS = "real response tokens of the trained batch (token-weighted over micro-batches and processes)"
LOSS_TOKENS = "tokens of the trained batch in the loss (token-weighted over micro-batches and processes)"
DRAWN = "drawn responses"
EVAL_ROWS = "the benchmark's problems (eval.max_problems), one greedy answer each (and eval.n samples)"

SECTIONS = (
    ("The record", (
        Metric("step", "The training step the record belongs to (0: the evaluation before training).", "-",
               "every record", EVERY),
    )),
    ("Correctness and rewards", (
        Metric("accuracy/drawn", "Fraction judged correct (the verdict: tokenpo/rewards), unshaped and unfiltered: the "
               "training correctness that compares across algorithms.", f"{DRAWN} whose gold answer parses",
               "every step"),
        Metric("accuracy", "Fraction judged correct, after dynamic sampling's filter (filtered: DAPO's batch keeps "
               "mixed groups only, so it reads higher than accuracy/drawn).", f"{TRAINED}, valid golds", "every step"),
        Metric("reward/mean", "Mean sequence reward the algorithm trained on: shaped (algorithm.reward.correct/wrong, "
               "reward.functions, shaping, format bonus) and filtered.", f"{TRAINED}, valid golds", "every step"),
        Metric("reward/std", "Standard deviation of those shaped rewards.", f"{TRAINED}, valid golds", "every step"),
        Metric("reward/shaped_mean", "Mean shaped reward before the format bonus, every row (valid golds or not).",
               TRAINED, "every step"),
        Metric("reward/shaped/<polarity>", "Mean shaped reward (before the format bonus) of the correct (pos) or wrong "
               "(neg) responses.", f"{TRAINED}, one polarity", "every step where that polarity has a response",
               logged=_depends),
        Metric("reward/kept_frac", "Fraction kept in the loss by DAPO's overlong filter (1 without it).", TRAINED,
               "every step"),
        Metric("reward/overlong_penalty_mean", "Mean DAPO soft overlong punishment (≤ 0).", TRAINED,
               "with algorithm.shaping.soft_overlong", logged=lambda cfg: cfg.algorithm.shaping.soft_overlong),
        Metric("reward/grop_penalty_mean", "Mean GTPO group-relative overlong punishment (≤ 0).", TRAINED,
               "with algorithm.shaping.grop", logged=lambda cfg: cfg.algorithm.shaping.grop),
        Metric("reward/grop_penalized_frac", "Fraction GROP punished.", TRAINED, "with algorithm.shaping.grop",
               logged=lambda cfg: cfg.algorithm.shaping.grop),
        Metric("reward/asked_format_frac", "Fraction answering in the asked-for form (e.g. \\boxed{}), which "
               "reward.format_weight pays.", TRAINED, "every step"),
        Metric("reward/correct_frac", "Verdict fraction: correct.", TRAINED, "every step"),
        Metric("reward/wrong_frac", "Verdict fraction: an answer that is not the gold.", TRAINED, "every step"),
        Metric("reward/no_answer_frac", "Verdict fraction: no answer in the asked-for form nor by the fallback.",
               TRAINED, "every step"),
        Metric("reward/format_rejected_frac", "Verdict fraction: an answer that is not one answer (`15 + 54`, "
               "`not 69`, hedged).", TRAINED, "every step"),
        Metric("reward/timeout_frac", "Verdict fraction: scoring ran past reward.timeout_s.", TRAINED, "every step"),
        Metric("reward/error_frac", "Verdict fraction: a reward function raised or returned a wrong type, or a scoring "
               "worker died (trainer.health.reward_errors stops a run where it stays near 1).", TRAINED, "every step"),
        Metric("reward/answer_extracted_frac", "Fraction whose answer was found and compared (correct or wrong).",
               TRAINED, "every step"),
        Metric("reward/gold_invalid", "Count of responses whose gold answer does not parse (out of the loss).", TRAINED,
               "every step"),
    )),
    ("Groups and advantages", (
        Metric("groups/zero_variance_frac", "Fraction of groups whose responses are all right or all wrong (no signal "
               "for a group-relative advantage).", f"groups of {TRAINED}", "every step"),
        Metric("advantage/abs_mean", "Mean |advantage| per token.", "real response tokens of the trained batch",
               "every step"),
    )),
    ("Entropy", (
        Metric("entropy/mean", "Mean token entropy of the policy during the update (nats).", TOKENS, "every step"),
        Metric("entropy/<polarity>", "Mean token entropy of correct (pos) or wrong (neg) responses (nats).",
               f"{TOKENS}, one polarity", "every step where that polarity has a response", logged=_depends),
        Metric("entropy/coef", "The entropy bonus's coefficient this step (fixed, or adaptive entropy control's).", "-",
               "every step"),
        Metric("entropy_top/threshold", "80/20: entropy above which a token keeps its policy gradient.",
               "each selection batch's valid tokens, averaged", "with algorithm.loss.entropy_top_frac",
               logged=_entropy_top),
        Metric("entropy_top/kept_frac", "80/20: fraction of tokens that keep their policy gradient.", LOSS_TOKENS,
               "with algorithm.loss.entropy_top_frac", logged=_entropy_top),
        Metric("entropy_top/kept_entropy_mean", "80/20: mean entropy of the tokens kept (nats).", LOSS_TOKENS,
               "with algorithm.loss.entropy_top_frac", logged=_entropy_top),
    )),
    ("Response lengths", (
        Metric("response_length/mean", "Mean response length (tokens).", f"{TRAINED}, valid golds", "every step"),
        Metric("response_length/max", "Longest response (tokens).", f"{TRAINED}, valid golds", "every step"),
        Metric("response_length/truncated_frac", "Fraction stopped by rollout.max_new_tokens.", TRAINED, "every step"),
    )),
    ("The loss and its terms", (
        Metric("loss", "The step's total loss (sum over micro-batches and processes, mean over mini-batches).",
               TRAINED, "every step"),
        Metric("loss/pg", "Policy-gradient term of the loss, aggregated as algorithm.aggregation says.", LOSS_TOKENS,
               "every step"),
        Metric("loss/kl", "KL terms of the loss (β·KL to the reference or old policy, TEPO's masked KL).",
               LOSS_TOKENS, "every step"),
        Metric("loss/entropy", "Entropy-bonus term of the loss (−c·entropy).", LOSS_TOKENS,
               "when the entropy coefficient is not 0", logged=_entropy_bonus),
        Metric("kl/ref", "k3 KL of the policy to the frozen reference per token.", LOSS_TOKENS,
               "when a KL term pulls towards the reference", logged=_reference),
        Metric("kl/old", "k3 KL of the policy being updated to the rollout policy per token (0 with one update per "
               "rollout: every importance ratio is 1).", LOSS_TOKENS, "every step"),
        Metric("clip/low_frac", "Fraction of tokens whose gradient the lower clip cuts (A < 0, ratio < 1 − ε_low; 0 "
               "with one update per rollout).", LOSS_TOKENS, "with surrogate clipped or clip_cov", logged=CLIPPED),
        Metric("clip/high_frac", "Fraction of tokens whose gradient the upper clip cuts (A > 0, ratio > 1 + ε_high; 0 "
               "with one update per rollout).", LOSS_TOKENS, "with surrogate clipped or clip_cov", logged=CLIPPED),
        Metric("clip/dual_frac", "Fraction of A < 0 tokens past the dual-clip bound c.", LOSS_TOKENS,
               "with algorithm.loss.dual_clip set (clipped, clip_cov)",
               logged=lambda cfg: CLIPPED(cfg) and cfg.algorithm.loss.dual_clip is not None),
        Metric("cispo/clipped_frac", "CISPO: fraction of tokens whose IS weight the clip changed.", LOSS_TOKENS,
               "with surrogate cispo", logged=_surrogate("cispo")),
        Metric("cispo/weight_mean", "CISPO: mean clipped IS weight.", LOSS_TOKENS, "with surrogate cispo",
               logged=_surrogate("cispo")),
        Metric("gmpo/clip_high_frac", "GMPO: fraction of A > 0 tokens whose log-ratio the upper clip cuts.",
               LOSS_TOKENS, "with surrogate gmpo", logged=_surrogate("gmpo")),
        Metric("gmpo/clip_low_frac", "GMPO: fraction of A < 0 tokens whose log-ratio the lower clip cuts.",
               LOSS_TOKENS, "with surrogate gmpo", logged=_surrogate("gmpo")),
        Metric("gmpo/ratio_mean", "GMPO: mean geometric-mean sequence ratio.", "responses of the trained batch",
               "with surrogate gmpo", logged=_surrogate("gmpo")),
        Metric("sapo/gate_mean", "SAPO: mean soft gate f(r).", LOSS_TOKENS, "with surrogate sapo",
               logged=_surrogate("sapo")),
        Metric("sapo/grad_weight_mean", "SAPO: mean gradient weight r·f'(r).", LOSS_TOKENS, "with surrogate sapo",
               logged=_surrogate("sapo")),
        Metric("sapo/grad_weight_<polarity>", "SAPO: mean gradient weight of A > 0 (pos) or A < 0 (neg) tokens.",
               LOSS_TOKENS, "with surrogate sapo", logged=_surrogate("sapo")),
        Metric("clip_cov/selected_frac", "Clip-Cov: fraction of tokens whose gradient is stopped.", LOSS_TOKENS,
               "with surrogate clip_cov", logged=_surrogate("clip_cov")),
        Metric("kl_cov/selected_frac", "KL-Cov: fraction of tokens that get the KL penalty.", LOSS_TOKENS,
               "with surrogate kl_cov", logged=_surrogate("kl_cov")),
        Metric("cov/mean", "Mean covariance of advantage and log-prob (arXiv 2505.22617).", LOSS_TOKENS,
               "with surrogate clip_cov or kl_cov", logged=_surrogate("clip_cov", "kl_cov")),
        Metric("tepo/mask_frac", "TEPO: fraction of tokens the KL mask selects (0 with one update per rollout and the "
               "old_token reference).", LOSS_TOKENS, "with algorithm.loss.kl_mask_coef > 0",
               logged=lambda cfg: cfg.algorithm.loss.kl_mask_coef > 0),
        Metric("tis/weight_mean", "Mean TIS weight min(π_train/π_sampler, C) on the policy gradient.", LOSS_TOKENS,
               "with algorithm.loss.tis_cap and an engine that returns log-probs", logged=_tis),
        Metric("tis/raw_weight_max", "Largest uncapped π_train/π_sampler.", LOSS_TOKENS, "as tis/weight_mean",
               logged=_tis),
        Metric("tis/capped_frac", "Fraction of tokens at or past the TIS cap.", LOSS_TOKENS, "as tis/weight_mean",
               logged=_tis),
        Metric("mismatch/abs_logp_diff", "Mean |log π_trainer − log π_sampler| on the sampled tokens.", LOSS_TOKENS,
               "where the rollout engine returns log-probs (rollout=vllm) and they are not the old policy's",
               logged=_sampler_logprobs),
        Metric("mismatch/kl", "k3 KL of the sampler to the trainer's rollout policy on the sampled tokens.",
               LOSS_TOKENS, "as mismatch/abs_logp_diff", logged=_sampler_logprobs),
    )),
    ("Optimisation", (
        Metric("grad_norm", "Gradient norm of the step's last update, before clipping.", "-", "every step"),
        Metric("lr", "Learning rate of the step's updates.", "-", "every step"),
    )),
    ("Dynamic sampling", (
        Metric("dynamic_sampling/rounds", "Generation rounds this step.", "-", "with dynamic sampling on",
               logged=_dynamic_sampling),
        Metric("dynamic_sampling/prompts", "Prompts (groups) drawn over the rounds.", "-", "with dynamic sampling on",
               logged=_dynamic_sampling),
        Metric("dynamic_sampling/mixed_groups", "Drawn groups with both right and wrong answers.", "-",
               "with dynamic sampling on", logged=_dynamic_sampling),
        Metric("dynamic_sampling/filled_groups", "All-equal groups added to reach data.prompts_per_step "
               "(on_exhausted: fill).", "-", "with dynamic sampling on", logged=_dynamic_sampling),
        Metric("dynamic_sampling/dropped_groups", "Mixed groups left out (beyond prompts_per_step, or keep_partial's "
               "uneven rest).", "-", "with dynamic sampling on", logged=_dynamic_sampling),
        Metric("dynamic_sampling/exhausted", "1 when the rounds ran out with too few mixed groups.", "-",
               "with dynamic sampling on", logged=_dynamic_sampling),
        Metric("dynamic_sampling/filtered_frac", "Fraction of drawn groups the filter dropped.", "-",
               "with dynamic sampling on", logged=_dynamic_sampling),
        Metric("dynamic_sampling/batch_groups", "Groups in the trained batch.", "-", "with dynamic sampling on",
               logged=_dynamic_sampling),
    )),
    ("The update's passes", (
        Metric("batch/padding_frac", "Fraction of the update passes' token positions that were padding.",
               "every process's passes", "every step"),
        Metric("batch/tokens_per_micro_batch", "Token positions per forward/backward pass.", "every process's passes",
               "every step"),
        Metric("batch/micro_batches", "Passes per process per step.", "-", "every step"),
        Metric("batch/rank_imbalance", "Busiest process's tokens over the mean, minus 1.", "-", "every step"),
    )),
    ("Rollouts ahead of the update", (
        Metric("async/staleness", "Mean policy versions between a round's sampling policy and the update.",
               "the step's rounds", "with rollout.async.max_staleness >= 1", logged=_ahead),
        Metric("async/staleness_max", "Largest staleness of the step's rounds.", "the step's rounds",
               "with rollout.async.max_staleness >= 1", logged=_ahead),
        Metric("async/staleness_frac_<lag>", "Fraction of the step's rounds that were <lag> versions stale.",
               "the step's rounds", "with rollout.async.max_staleness >= 1, for each lag seen", logged=_depends),
        Metric("async/token_staleness", "Mean policy versions between the version that sampled a token and the "
               "update (a partial rollout's tokens each count their own).", "the step's response tokens",
               "with rollout.async.max_staleness >= 1 on an engine that reports each token's version (vllm_server)",
               logged=_depends),
        Metric("async/partial_frac", "Fraction of the step's responses sampled by more than one policy version "
               "(partial rollouts, rollout.server.in_flight=keep).", DRAWN,
               "with rollout.async.max_staleness >= 1 on an engine that reports each token's version (vllm_server)",
               logged=_depends),
    )),
    ("Health", (
        Metric("health/<detector>_fired", "1 when trainer.health.<detector> fired this step (docs/reliability.md).",
               "-", "every step"),
        Metric("health/skipped_updates", "Optimizer updates not applied so far in the run.", "-", "every step"),
    )),
    ("Time, throughput, memory", (
        Metric("time/elapsed_s", "Training seconds so far (the evaluation before training excluded; 0 at step 0).", "-",
               "every record", EVERY),
        Metric("tokens/generated", "Response tokens generated this step, every dynamic-sampling round's included.",
               DRAWN, "every step"),
        Metric("tokens/generated_total", "Response tokens generated so far (continues across a resume): "
               "tokenpo.compare's equal-compute axis.", DRAWN, "every record", EVERY),
        Metric("throughput/tokens_per_s", "Tokens of the trained batch's responses per second of the step.", TRAINED,
               "every step"),
        Metric("timing/step_s", "Seconds of the whole step.", "-", "every step"),
        Metric("timing/generate_s", "Seconds generating (or taking rounds generated ahead).", "-", "every step"),
        Metric("timing/reward_s", "Seconds scoring.", "-", "every step"),
        Metric("timing/update_s", "Seconds of the update passes.", "-", "every step"),
        Metric("timing/weight_sync_s", "Seconds bringing the rollout engine's weights to the policy's.", "-",
               "every step"),
        Metric("timing/old_logprob_s", "Seconds of the old policy's no-grad pass.", "-",
               "when a step runs it (trainer.mini_batches > 1, an entropy-reading algorithm, a step-wide selection)",
               logged=_old_pass),
        Metric("timing/reference_s", "Seconds of the reference's no-grad pass.", "-",
               "when a KL term pulls towards the reference", logged=_reference),
        Metric("timing/trainer_wait_rollouts_s", "Seconds the trainer waited for rounds generated ahead.", "-",
               "with rollout.async.max_staleness >= 1", logged=_ahead),
        Metric("timing/trainer_wait_weights_s", "Seconds the trainer waited to hand the generator its weights.", "-",
               "with rollout.async.max_staleness >= 1", logged=_depends),
        Metric("timing/generator_s", "Seconds the generator process spent generating.", "-",
               "with rollout.async.max_staleness >= 1", logged=_ahead),
        Metric("timing/generator_wait_weights_s", "Seconds the generator waited for weights.", "-",
               "with rollout.async.max_staleness >= 1", logged=_ahead),
        Metric("timing/weight_push_s", "Seconds the step's weight push to the servers took, generation paused "
               "(rollout=vllm_server).", "-", "on servers", logged=_servers),
        Metric("timing/weight_push_drain_s", "Of the push's seconds, the pause itself: requests in flight finishing "
               "(rollout.server.in_flight=wait).", "-", "on servers", logged=_servers),
        Metric("rollout/weight_push_mib", "MiB of weights the step pushed to each server.", "-", "on servers",
               logged=_servers),
        Metric("rollout/requests_resampled", "Requests a push dropped and sampled again "
               "(rollout.server.in_flight=abort).", "-", "when a push dropped some", logged=_depends),
        Metric("memory/cuda_peak_allocated_bytes", "Peak CUDA memory torch's tensors took so far.", "this process",
               "on CUDA", logged=_depends),
        Metric("memory/cuda_peak_reserved_bytes", "Peak CUDA memory torch's caching allocator held so far.",
               "this process", "on CUDA", logged=_depends),
    )),
    ("Held-out evaluation", (
        Metric("eval/accuracy", "The main benchmark's accuracy (greedy, or mean@n without greedy): the run's headline "
               "number.", EVAL_ROWS, "on evaluation steps", EVAL, logged=_depends),
        Metric("eval/<bench>/accuracy", "The benchmark's accuracy (greedy, or mean@n without greedy).", EVAL_ROWS,
               "on evaluation steps, for eval and each eval.extra benchmark", EVAL, logged=_depends),
        Metric("eval/<bench>/greedy/accuracy", "Fraction of greedy answers judged correct.", EVAL_ROWS,
               "on evaluation steps, with greedy answers", EVAL, logged=_depends),
        Metric("eval/<bench>/mean@<n>", "Mean fraction correct of the n samples per problem (avg@n).", EVAL_ROWS,
               "on evaluation steps, with eval.n > 0", EVAL, logged=_depends),
        Metric("eval/<bench>/pass@<k>", "Unbiased pass@k from the n samples (Chen et al. 2021).", EVAL_ROWS,
               "on evaluation steps, each k of eval.pass_k", EVAL, logged=_depends),
        Metric("eval/<bench>/maj@<n>", "Majority-vote accuracy over the n samples.", EVAL_ROWS,
               "on evaluation steps, with eval.n > 0", EVAL, logged=_depends),
        Metric("eval/<bench>/num_problems", "Problems evaluated.", EVAL_ROWS, "on evaluation steps", EVAL,
               logged=_depends),
        Metric("eval/<bench>/asked_format_frac", "Fraction of responses answering in the asked-for form.",
               "every response of the benchmark", "on evaluation steps", EVAL, logged=_depends),
        Metric("eval/<bench>/<verdict>_frac", "Verdict fractions (correct, wrong, no_answer, format_rejected, timeout, "
               "error, answer_extracted) as reward/* defines them.", "every response of the benchmark",
               "on evaluation steps", EVAL, logged=_depends),
        Metric("eval/<bench>/gold_invalid", "Count of problems whose gold answer does not parse.",
               "every response of the benchmark", "on evaluation steps", EVAL, logged=_depends),
    )),
)
METRICS = tuple(metric for _, metrics in SECTIONS for metric in metrics)


def entry(key: str) -> Metric | None:
    """The registry entry a logged key matches (the first, in registry order), or None."""
    return next((metric for metric in METRICS if metric.pattern.match(key)), None)


def glossary() -> str:
    """docs/metrics.md: every entry, section by section, in registry order."""
    words = __doc__.split("Words the definitions use:\n", 1)[1].strip().split("\n- ")
    lines = ["<!-- generated by `python -m tokenpo.metrics_registry > docs/metrics.md` from "
             "tokenpo/metrics_registry.py; edit that file, not this one -->", "", "# Metrics", "",
             "Every key a run logs to `metrics.jsonl` and W&B (one record per step; step 0 holds the evaluation before "
             "training), what it is, over which rows, and when it is logged. `<name>` stands for a part of the key "
             "(`<bench>`: a benchmark's `eval.name`; `<polarity>`: `pos` for correct, `neg` for wrong responses). "
             "`python -m tokenpo.compare` plots `accuracy/drawn` first: the one training curve no algorithm shapes "
             "or filters.", "", "Words the definitions use:", ""]
    lines += [f"- {' '.join(part.strip() for part in word.lstrip('- ').splitlines())}" for word in words]
    for title, metrics in SECTIONS:
        lines += ["", f"## {title}", "", "| key | what it is | over | logged |", "|---|---|---|---|"]
        for metric in metrics:
            cells = [f"`{metric.key}`", metric.definition, metric.rows, metric.when]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(glossary())
