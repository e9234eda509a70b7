"""Time TRL's GRPOTrainer on the same model, prompts, group size, lengths, beta and learning rate as tokenpo.

TRL gets tokenpo's chat messages for the steps' prompts in tokenpo's sampling order (shuffle off, one
step = `prompts` prompts x G), and the prompt token ids are checked to be identical to tokenpo's. The
reward is tokenpo's own answer check, in process. Phases are timed from outside by wrapping the trainer
instance's generation, reward and log-prob methods and the accelerator's backward, plus callbacks. With
`model.lora.rank` >= 1 TRL gets the PEFT config tokenpo builds (`tokenpo.models.lora.peft_config`): the same
adapters, and the base model with its adapters off as the reference, as tokenpo's.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections import defaultdict

import torch

from tokenpo.bench.settings import BenchSettings, step_examples, train_config
from tokenpo.bench.stats import model_shape
from tokenpo.models.config import LoraConfig
from tokenpo.models.lora import peft_config


def chat_messages(problem: str, template) -> list[dict]:
    """The conversation tokenpo's chat template renders for `problem` (tokenpo.data.prompts.build_prompt)."""
    messages = [{"role": "user", "content": problem + template.instruction}]
    if template.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": template.system_prompt})
    return messages


def check_same_prompt_ids(examples, tokenizer, template) -> None:
    """TRL tokenises conversational prompts with apply_chat_template; it must give tokenpo's exact ids."""
    from tokenpo.data.prompts import prompt_token_ids

    trl_ids = tokenizer.apply_chat_template([chat_messages(e.problem, template) for e in examples],
                                            add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    for example, ids in zip(examples, trl_ids, strict=True):
        if list(ids) != prompt_token_ids(example.problem, tokenizer, template):
            raise RuntimeError(f"TRL's prompt tokens differ from tokenpo's for {example.problem!r}")


def reward_function(reward_cfg):
    """TRL reward function: tokenpo's verdict under the same reward settings, 1 if correct else 0."""
    from tokenpo.rewards import CORRECT, answer_spec, judge

    spec = answer_spec(reward_cfg)

    def arith_reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(judge(t, gold, spec) == CORRECT) for t, gold in zip(texts, answer, strict=True)]

    return arith_reward


def pretrained_dir(cfg, tokenizer, model, tmp: str) -> str:
    """A folder TRL can load the policy (and build its reference) from: the converted checkpoint, or the
    tiny model saved there."""
    from tokenpo.models.loading import resolve_pretrained_dir

    if cfg.model.source != "tiny":
        return resolve_pretrained_dir(cfg.model)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return tmp


def adapters_off(model) -> bool:
    """Whether `model` is a PEFT model running as its base (the adapters switched off)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(module.disable_adapters for module in model.modules() if isinstance(module, BaseTunerLayer))


def instrument(trainer, steps: list[dict]):
    """Time TRL's phases per optimizer step; completed steps are appended to `steps`."""
    from transformers import TrainerCallback

    totals: dict = defaultdict(float)
    marks: dict = {}
    group = trainer.num_generations

    def timed(fn, key, after=None):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            totals[key] += time.perf_counter() - start
            if after is not None:
                after(out)
            return out

        return wrapper

    def count_tokens(out):
        prompt_ids, completion_ids = out[0], out[1]
        totals["completion_tokens"] += sum(len(c) for c in completion_ids)
        # the prompt list holds each prompt G times; the useful work counts it once
        totals["prompt_tokens"] += sum(len(p) for p in prompt_ids[::group])

    logps = trainer._get_per_token_logps_and_entropies

    def per_token_logps(model, *args, **kwargs):
        # a LoRA run has no reference model: the reference pass is the policy with its adapters switched off
        if model is trainer.ref_model or adapters_off(model):
            return timed(logps, "reference")(model, *args, **kwargs)
        if not torch.is_grad_enabled():
            return timed(logps, "old_logprob")(model, *args, **kwargs)
        return logps(model, *args, **kwargs)  # the policy forward of the update

    trainer._generate = timed(trainer._generate, "generate", count_tokens)
    trainer._calculate_rewards = timed(trainer._calculate_rewards, "reward")
    trainer._get_per_token_logps_and_entropies = per_token_logps
    trainer.accelerator.backward = timed(trainer.accelerator.backward, "backward")
    trainer._clip_grad_norm = timed(trainer._clip_grad_norm, "optimizer")

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            totals.clear()
            marks["step"], marks["cpu"] = time.perf_counter(), time.process_time()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            marks["optimizer"] = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            totals["optimizer"] += time.perf_counter() - marks["optimizer"]

        def on_step_end(self, args, state, control, **kwargs):
            step = {"step_s": time.perf_counter() - marks["step"], "step_cpu_s": time.process_time() - marks["cpu"]}
            for key in ("generate", "reward", "reference", "old_logprob", "backward", "optimizer", "weight_sync",
                        "completion_tokens", "prompt_tokens"):
                step[key] = totals.get(key, 0.0)
            # same definitions as tokenpo: update = the rest of the step; policy_forward = update - backward - optimizer
            step["update"] = step["step_s"] - sum(step[k] for k in ("generate", "reward", "reference", "old_logprob"))
            step["policy_forward"] = step["update"] - step["backward"] - step["optimizer"]
            steps.append(step)

    trainer.add_callback(StepTimer())


def grpo_trainer(s: BenchSettings, cfg, tokenizer, source: str, rows: list[dict], out_dir: str):
    """TRL's GRPOTrainer at settings `s` on the model in `source` and the dataset `rows`."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    accumulation = s.prompts * s.group_size // s.sequences_per_pass
    args = GRPOConfig(
        output_dir=out_dir, use_cpu=True, seed=s.seed, max_steps=s.steps, report_to="none", logging_steps=1,
        save_strategy="no", eval_strategy="no", disable_tqdm=True,
        # one step = one generation batch of prompts x G, one optimizer update on all of it, accumulated
        # over micro-batches of the same size as tokenpo's
        per_device_train_batch_size=s.sequences_per_pass, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, num_iterations=1, num_generations=s.group_size,
        shuffle_dataset=False,
        max_completion_length=s.max_new_tokens, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
        beta=s.beta, learning_rate=s.lr, optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=cfg.trainer.weight_decay, max_grad_norm=cfg.trainer.max_grad_norm,
        adam_beta1=cfg.trainer.adam_betas[0], adam_beta2=cfg.trainer.adam_betas[1],
        epsilon=cfg.algorithm.loss.clip_low, epsilon_high=cfg.algorithm.loss.clip_high,
        loss_type="grpo", scale_rewards="group",
        bf16=False, fp16=False, gradient_checkpointing=False, use_vllm=False,
        model_init_kwargs={"dtype": "float32", "attn_implementation": cfg.model.attn_implementation},
    )
    # model.lora as tokenpo builds it (the same PEFT LoraConfig), or full fine-tuning
    lora = peft_config(cfg.model.lora) if cfg.model.lora.enabled else None
    return GRPOTrainer(model=source, reward_funcs=reward_function(cfg.reward_for(cfg.data)), args=args,
                       train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=lora)


def run_trl(s: BenchSettings) -> dict:
    """{"steps": [...], "shape": ..., "trl_version": ...} of `s.steps` GRPOTrainer steps at settings `s`."""
    import trl

    from tokenpo.models.loading import load_model

    cfg, _ = train_config(s)
    torch.manual_seed(cfg.seed)
    # the base model: TRL adds the same LoRA adapters itself (grpo_trainer)
    tokenizer, model = load_model(dataclasses.replace(cfg.model, lora=LoraConfig()), cfg.seed)
    batches = step_examples(cfg, s.steps)
    template = cfg.data.template
    check_same_prompt_ids(batches[0], tokenizer, template)
    rows = [{"prompt": chat_messages(e.problem, template), "answer": e.answer} for batch in batches for e in batch]
    steps: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tokenpo-bench-trl-") as tmp:
        source = pretrained_dir(cfg, tokenizer, model, tmp)
        del model
        trainer = grpo_trainer(s, cfg, tokenizer, source, rows, tmp)
        shape = model_shape(trainer.model)
        instrument(trainer, steps)
        torch.set_num_threads(s.threads)
        trainer.train()
    return {"steps": steps, "shape": shape, "trl_version": trl.__version__}
