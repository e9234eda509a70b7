"""Run logging: metrics.jsonl, W&B and the console (config group `logger`)."""
