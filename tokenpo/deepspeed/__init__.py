"""DeepSpeed ZeRO engines and the process group (config group `deepspeed`)."""
