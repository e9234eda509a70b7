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
output_dir is `outputs/eval/<model>/eval_<eval.name>/` under the current directory, never inside the evaluated folder
(`<model>`: `<parent>__<name>` of a run dir or model folder, `<org>__<name>` of a hub id). The metrics are printed as
a markdown table.
Groups `eval`, `data` (the benchmark when eval.data is null, e.g. eval=arith), `reward` and `rollout` (engine,
eos_tokens, and max_new_tokens where eval.max_new_tokens is null) are the training run's groups. Answers are
judged as training-time evaluation judges them (tokenpo.evaluation.judging.benchmark_reward): read as the benchmark's data
config says, with reward.fn, reasoning_tag and timeout_s from `reward` (reward.answer_* are refused).
"""

from __future__ import annotations

import json
import sys
import textwrap

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from tokenpo import CONF_DIR
from tokenpo.cli_help import group_options
from tokenpo.errors import ConfigError
from tokenpo.evaluation.cli import build_eval_run, report, run_evaluation
from tokenpo.train import fail

# each setting of tokenpo.evaluate besides its config groups: (default, what it is); `--help` prints them
ARGUMENTS = {
    "model_path": (None, "what to evaluate: a run dir (its final/ is evaluated), a Hugging Face model folder, a hub id "
                         "(org/name), or a PEFT adapter folder whose adapter_config.json names its base; required "
                         "unless adapter_path names its base"),
    "adapter_path": (None, "a PEFT adapter folder (a LoRA run's final/adapter) applied to model_path, or to its own "
                           "base when model_path is null"),
    "output_dir": (None, "folder of eval.json (metrics, every problem's responses and verdicts); null = "
                         "outputs/eval/<model>/eval_<eval.name> under the current directory, outside the evaluated "
                         "folder (<model>: the run dir's parent__name, or org__name of a hub id)"),
    "dtype": ("float32", "parameter dtype the model is evaluated in: float32 | bfloat16 | float16"),
    "attn_implementation": ("sdpa", "attention kernel: sdpa | eager | flash_attention_2"),
    "trust_remote_code": (False, "run model code from the hub repo (needed by some architectures)"),
    "seed": (0, "seed of the sampled responses (eval.n > 0); greedy answers do not depend on it"),
    "print_samples": (4, "question -> response -> verdict lines printed under the metrics table"),
}

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
    **{name: default for name, (default, _) in ARGUMENTS.items()},
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


def usage() -> str:
    """`--help`: this module's examples, each argument with its default and meaning, the groups it reads."""
    arguments = "\n".join(textwrap.fill(f"{name}={json.dumps(default)}: {text}", 110, initial_indent="  ",
                                         subsequent_indent="      ") for name, (default, text) in ARGUMENTS.items())
    return (f"usage: python -m tokenpo.evaluate model_path=<run dir | model folder | org/name> [eval=<benchmark>] "
            f"[key=value ...]   (installed: tokenpo-evaluate ...)\n{__doc__.split(chr(10), 1)[1].rstrip()}\n\n"
            f"arguments (key=default: meaning):\n{arguments}\n\nbenchmarks (eval=<option>): "
            f"{', '.join(group_options(CONF_DIR, 'eval'))}; a group's keys: python -m tokenpo.train --explain eval")


def main() -> None:
    from tokenpo.progress import quiet_library_bars

    if {"-h", "--help"} & set(sys.argv[1:]):
        print(usage())
        return
    quiet_library_bars()
    hydra_main()


if __name__ == "__main__":
    main()
