"""Rollouts on vLLM, colocated with the trainer in each process (as TRL's `vllm_mode=colocate` and verl's hybrid
engine run it): every rank has its own engine and generates its own share of the groups.

The engine starts from the published version's config and tokenizer with dummy weights and gets every weight from
`load`, the same call that follows each policy update, so a load cannot silently miss a layer
(tests/rollout/test_vllm_engine.py checks the log-probs after several updates). Weights stream one module at a
time (`Published.tensors`, tokenpo/models/weight_stream.py): under ZeRO-3 each module's shards are gathered only
while that module's weights are handed over, and a LoRA policy's layers arrive merged (W + scale·B·A).

vLLM's CPU backend repacks every linear weight for its GEMM kernels and leaves an empty parameter behind, so
`load_weights` into the live model has nowhere to write; there the sync goes through vLLM's in-place reload
(`reload_weights`: restore each layer, load, re-run the weight post-processing). On GPUs the weights are
copied into the live model with `load_weights`, as TRL and verl do.
"""

from __future__ import annotations

import logging
import os

import torch

from tokenpo.deepspeed import dist
from tokenpo.rollout.config import vllm_sizing
from tokenpo.rollout.engine import ENGINES, Responses, SamplingParams
from tokenpo.models.published import Published
from tokenpo.rollout.generator import AnsweredNow
from tokenpo.rollout.model_folder import model_folder

# vLLM's own RNG only serves requests without a seed; each request gets one drawn from the run's generator
SEED_RANGE = 2**31 - 1


@ENGINES.register("vllm")
class VLLMEngine(AnsweredNow):
    def __init__(self, cfg, tokenizer, published: Published, device: torch.device) -> None:
        # colocated: vLLM runs in this process (its worker reads the weights this process streams to it)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM
        from vllm.platforms import current_platform

        v = cfg.vllm
        sizing = vllm_sizing(v, "cpu" if current_platform.is_cpu() else "cuda")
        self.published, self.device, self.answers = published, device, {}
        self.in_place_reload = current_platform.is_cpu()
        self.sleep_mode = v.sleep_mode and current_platform.is_sleep_mode_available()
        self.sleep_level = v.sleep_level
        # asleep: the KV cache is released; weights_discarded: the weights too (level 2), until the next sync
        self.asleep = self.weights_discarded = False
        dtype = v.dtype if v.dtype != "auto" else str(published.dtype).removeprefix("torch.")
        self.folder = model_folder(published.config, published.architecture, tokenizer)
        self.llm = LLM(
            model=self.folder.name,
            load_format="dummy",  # every weight comes from load
            dtype=dtype,
            seed=v.seed,
            tensor_parallel_size=v.tensor_parallel_size,
            gpu_memory_utilization=sizing.gpu_memory_utilization,
            kv_cache_memory_bytes=sizing.kv_cache_bytes,
            enforce_eager=sizing.enforce_eager,
            max_model_len=v.max_model_len,
            enable_sleep_mode=self.sleep_mode,
            # sampling as the rollout config says, not as the model folder's generation_config.json would
            generation_config="vllm",
            # log-probs after temperature (and top-p): those of the distribution the tokens were drawn from
            logprobs_mode="processed_logprobs",
            # every rank runs its own engine inside the launcher's process group
            distributed_executor_backend="external_launcher" if dist.world_size() > 1 else None,
        )

    def sample(self, prompt_ids, params: SamplingParams, rng: torch.Generator) -> Responses:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()
        # one seed per prompt (vLLM gives its G samples seed, seed + 1, ...): the same draws whatever the batching
        seeds = torch.randint(SEED_RANGE, (len(prompt_ids),), generator=rng, device=rng.device).tolist()
        requests = [VLLMSamplingParams(
            n=params.num_samples, temperature=params.temperature, top_p=params.top_p,
            max_tokens=params.max_new_tokens, seed=seed, logprobs=0, detokenize=False,
            # the stop tokens are exactly the rollout's (the tokenizer's EOS is among them), as in the hf engine
            stop_token_ids=list(params.stop_token_ids), ignore_eos=True)
            for seed in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], requests, use_tqdm=False)
        samples = [s for out in outputs for s in sorted(out.outputs, key=lambda s: s.index)]
        return Responses(
            token_ids=[list(s.token_ids) for s in samples],
            truncated=[s.finish_reason == "length" for s in samples],
            logprobs=[[step[token].logprob for step, token in zip(s.logprobs, s.token_ids)] for s in samples],
        )

    def load_weights(self, weights) -> None:
        """Copy (name, tensor) pairs in Hugging Face names into the engine's model."""
        if self.in_place_reload:
            # each reload warns that the rotary embedding got no weights: it has none, only a computed table
            logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                              "is_checkpoint_format": True})
        else:
            self.llm.apply_model(lambda model: model.load_weights(weights))
        # cached prompt KV was computed with the old weights
        self.llm.reset_prefix_cache()

    def load(self, published: Published) -> None:
        """Version `published.version`'s weights copied in; wakes a sleeping engine (the only way to wake one whose
        sleep discarded its weights)."""
        if self.asleep:
            # weights first, the KV cache after the copy: the peak stays at the policy + vLLM's weights (verl's
            # sharding manager and TRL's colocate mode wake `weights`, load, then wake `kv_cache`)
            self._wake(["weights"])
        self.load_weights(published.tensors())
        self.published, self.weights_discarded = published, False
        if self.asleep:
            # the stream's temporaries (ZeRO-3 gathers, LoRA merges) are freed by now: their cached blocks too
            self._wake(["kv_cache"])
            self.asleep = False

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            # level 2 (the default): the KV cache and the weights are discarded, not copied to host memory and back,
            # since the next sync overwrites every weight anyway (vLLM's sleep-mode docs: level 2 is for updating
            # the weights; verl uses it from vLLM 0.8.5, TRL's colocate mode too). vLLM >= 0.8.5 keeps the model's
            # buffers (RoPE tables) on the host across it and restores them with the weights (vllm PR 16889,
            # Worker.sleep/wake_up), so the sync need not send them. Level 1 offloads the weights to host memory
            # (rollout.vllm.sleep_level=1: for backends or models where level 2 breaks, e.g. vllm-ascend).
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
            self.weights_discarded = self.sleep_level == 2

    def wake_up(self) -> None:
        if self.asleep:
            if self.weights_discarded:
                # TRL reloads the checkpoint from disk here (collective_rpc("reload_weights")); this engine was built
                # with dummy weights, so only a sync can bring them back
                raise RuntimeError("the vLLM engine discarded its weights when it slept (sleep level 2): "
                                   "load(published) wakes it, not wake_up")
            self._wake(None)
            self.asleep = False

    def _wake(self, tags: list[str] | None) -> None:
        # vLLM wakes into its own memory pool (CuMemAllocator), outside torch's caching allocator, which still holds
        # the blocks the update freed: hand them back first (TRL empties the cache before each wake-up, verl before
        # waking the KV cache). A no-op without CUDA: torch.cuda.empty_cache does nothing until CUDA is initialised.
        torch.cuda.empty_cache()
        self.llm.wake_up(tags=tags)

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        self.folder.cleanup()
