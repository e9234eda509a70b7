"""`python -m tokenpo.evaluate` / `tokenpo-evaluate`: evaluate a checkpoint on a benchmark of the `eval` config group.

    python -m tokenpo.evaluate model_path=outputs/runs/<run>                      # the run's final/, held-out arith
    python -m tokenpo.evaluate model_path=outputs/runs/<run> eval=gsm8k \\
        eval.data.path=data/gsm8k_test.jsonl eval.max_problems=20
    python -m tokenpo.evaluate model_path=Qwen/Qwen2.5-Math-1.5B eval=math500 dtype=bfloat16
    python -m tokenpo.evaluate -m model_path=<folder> eval=gsm8k,math500         # one job per benchmark
    python -m tokenpo.evaluate model_path=outputs/runs/<run>/final/adapter        # a LoRA adapter on its base
    python -m tokenpo.evaluate model_path=<base folder> adapter_path=<adapter folder>

A benchmark reads one split, so its local file needs no `{split}`; a path that has one must be quoted for Hydra's
override grammar: 'eval.data.path="data/gsm8k_{split}.jsonl"'.
Results go to `<output_dir>/eval.json` (metrics and every problem's responses and verdicts); by default
output_dir is `<model_path>/eval_<eval.name>/` (beside a run's metrics, or inside a model folder) and
`outputs/eval/<org>__<name>/eval_<eval.name>/` for a hub id. The metrics are printed as a markdown table.
Groups `eval`, `data` (the benchmark when eval.data is null, e.g. eval=arith), `reward` and `rollout` (engine,
eos_tokens, and max_new_tokens where eval.max_new_tokens is null) are the training run's groups. Answers are
judged as training-time evaluation judges them (tokenpo.config.benchmark_reward): read as the benchmark's data
config says, with reward.fn, reasoning_tag and timeout_s from `reward` (reward.answer_* are refused).
"""

from __future__ import annotations

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from tokenpo import CONF_DIR
from tokenpo.errors import ConfigError
from tokenpo.evaluation.cli import build_eval_run, report, run_evaluation
from tokenpo.train import fail

EVALUATE_CONFIG = {
    "defaults": [
        {"eval": "arith"},
        {"data": "arith"},
        {"reward": "default"},
        {"rollout": "hf"},
        # logs to the console only: no <job>.log file beside wherever the command runs
        {"override hydra/job_logging": "stdout"},
        "_self_",
    ],
    # run dir (its final/ is evaluated), Hugging Face model folder, hub id (org/name), or PEFT adapter folder whose
    # adapter_config.json names its base; required unless adapter_path names its base
    "model_path": None,
    # PEFT adapter folder (a LoRA run's final/adapter) applied to model_path, or to its own base when model_path is null
    "adapter_path": None,
    # folder of eval.json; null = <model_path>/eval_<eval.name>, outputs/eval/<org>__<name>/eval_<eval.name> for a hub id
    "output_dir": None,
    # parameter dtype the model is evaluated in: float32 | bfloat16 | float16
    "dtype": "float32",
    # attention kernel: sdpa | eager | flash_attention_2
    "attn_implementation": "sdpa",
    # run model code from the hub repo (needed by some architectures)
    "trust_remote_code": False,
    # seed of the sampled responses (eval.n > 0); greedy answers do not depend on it
    "seed": 0,
    # question -> response -> verdict lines printed under the metrics table
    "print_samples": 4,
    # results go to output_dir, so Hydra writes no run folder, .hydra/ copy or log file of its own;
    # a multirun (-m) only leaves its multirun.yaml under outputs/eval/multirun/<time>
    "hydra": {"run": {"dir": "."}, "output_subdir": None,
              "sweep": {"dir": "outputs/eval/multirun/${now:%Y-%m-%d_%H-%M-%S}", "subdir": "."}},
}

ConfigStore.instance().store(name="evaluate", node=EVALUATE_CONFIG)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
def hydra_main(tree: DictConfig) -> float:
    try:
        run = build_eval_run(tree)
        result = run_evaluation(run)
    except ConfigError as err:
        fail(str(err))
    print(report(run, result), flush=True)
    return result.metrics["accuracy"]


def main() -> None:
    from tokenpo.progress import quiet_library_bars

    quiet_library_bars()
    hydra_main()


if __name__ == "__main__":
    main()
