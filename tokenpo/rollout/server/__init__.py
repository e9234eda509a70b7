"""Inference servers for `rollout=vllm_server`: the lifecycle of the server processes tokenpo starts (or is given by
URL) lives in `tokenpo.rollout.server.process` (start, readiness, liveness, stop; nothing vLLM-specific), and the
wrapper each started server runs under, which stops its whole process tree when the trainer dies, SIGKILL included,
in `tokenpo.rollout.server.guard`."""
