#!/usr/bin/env bash
# rollout=vllm_server end to end on this machine, case by case: the tiny model and the embedded
# default (SmolLM2-135M-Instruct), k = 0 and k = 1, on a server tokenpo starts and on one started by hand and named by
# URL (vLLM's own server module, as docs/rollout.md has a user start it): STEPS steps each with the held-out
# evaluation before and after, in the environment of scripts/setup_vllm.sh. Then one line per run: exit status,
# steps logged, pushes, the largest sampler-trainer gap over the steps (mismatch/abs_logp_diff: at k = 0 the
# server's log-probs against the trainer's for the same weights; the colocated engine's tests hold it below 1e-2),
# the staleness of the last step, held-out accuracy before and after. First the slow real-server tests (a server
# killed mid-run, then the same command on a new one; a SIGKILLed trainer). docs/records/vllm_server_check.md keeps
# a run.
#   STEPS (3), OUT (outputs/check_vllm_server), MODELS ("tiny default")
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/setup_vllm.sh | tail -n 1)"
STEPS="${STEPS:-3}"
OUT="${OUT:-outputs/check_vllm_server}"
MODELS="${MODELS:-tiny default}"
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 PYTHONPATH="$PWD"
COMMON=(logger.mode=disabled trainer.print_samples=0 data.prompts_per_step=4 rollout.group_size=4
        rollout.max_new_tokens=24 eval.max_problems=8 "trainer.max_steps=$STEPS" rollout.server.cpu_cores=1
        trainer.threads=1)
mkdir -p "$OUT"
# the real-server kill and resume runs (tests/rollout/server/test_vllm_server_runs.py, behind `slow`)
"$PY" -m pytest -q -p no:cacheprovider -m "vllm and slow" tests/rollout/server/test_vllm_server_runs.py

model_args() {  # MODEL -> its overrides
  # the tiny model with one 64-wide head: vLLM's CPU attention has no kernel for its 16-wide ones
  if [ "$1" = tiny ]; then echo "model=tiny model.tiny.num_heads=1"; fi
}

train() {  # NAME MODEL OVERRIDES...
  local name=$1 model=$2
  shift 2
  # shellcheck disable=SC2046
  "$PY" -m tokenpo.train rollout=vllm_server "${COMMON[@]}" $(model_args "$model") "$@" "hydra.run.dir=$OUT/$name" \
      > "$OUT/$name.log" 2>&1 && echo 0 > "$OUT/$name.rc" || echo $? > "$OUT/$name.rc"
}

hand_started() {  # MODEL PORT -> the server's pid; its log in $OUT/server_MODEL.log
  local folder="$OUT/folder_$1"
  # shellcheck disable=SC2046
  "$PY" - "$folder" $(model_args "$1") <<'PYEOF'
import sys
from tokenpo.models.loading import model_description
from tokenpo.plan.cli import compose_train_config
config, tokenizer = model_description(compose_train_config(sys.argv[2:]).model)  # what --model needs: no weights
config.save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
PYEOF
  VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=1 "$PY" -m vllm.entrypoints.openai.api_server \
      --model "$folder" --port "$2" --load-format dummy --dtype float32 --enforce-eager --enable-scale-out \
      --logprobs-mode processed_logprobs --generation-config vllm --max-num-batched-tokens 65536 \
      --weight-transfer-config '{"backend": "gloo"}' > "$OUT/server_$1.log" 2>&1 &
  echo $!
}

for model in $MODELS; do
  for k in 0 1; do
    [ -f "$OUT/${model}_started_k$k.rc" ] || train "${model}_started_k$k" "$model" "rollout.async.max_staleness=$k"
  done
  if [ ! -f "$OUT/${model}_url_k1.rc" ]; then
    port=$("$PY" -c "from tokenpo.deepspeed.dist import free_port; print(free_port())")
    pid=$(hand_started "$model" "$port")
    for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    for k in 0 1; do
      train "${model}_url_k$k" "$model" "rollout.async.max_staleness=$k" "rollout.server.urls=[http://127.0.0.1:$port]" \
          rollout.server.transfer_address=127.0.0.1
    done
    kill "$pid"  # the server started in a subshell: not this shell's child to wait for
    while kill -0 "$pid" 2> /dev/null; do sleep 1; done
  fi
done

"$PY" - "$OUT" $MODELS <<'PYEOF'
import json, sys
from pathlib import Path
out, models = Path(sys.argv[1]), sys.argv[2:]
print(f"{'run':<18} {'rc':>3} {'steps':>5} {'pushes':>6} {'max |dlogp|':>11} {'staleness':>9} {'acc before':>10} {'acc after':>9}")
for model in models:
    for where in ("started", "url"):
        for k in (0, 1):
            name = f"{model}_{where}_k{k}"
            rc = (out / f"{name}.rc").read_text().strip()
            rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()] \
                if (out / name / "metrics.jsonl").is_file() else []
            steps = [r for r in rows if r.get("step", 0) >= 1 and "timing/step_s" in r]
            evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
            gap = max((r["mismatch/abs_logp_diff"] for r in steps if "mismatch/abs_logp_diff" in r), default=float("nan"))
            pushes = sum(1 for r in steps if "timing/weight_push_s" in r)
            stale = steps[-1].get("async/staleness", 0.0) if steps else float("nan")
            before, after = (evals[0], evals[-1]) if len(evals) >= 2 else (float("nan"), float("nan"))
            print(f"{name:<18} {rc:>3} {len(steps):>5} {pushes:>6} {gap:>11.2e} {stale:>9.0f} {before:>10.3f} {after:>9.3f}")
PYEOF
