"""The RL training loop (config group `trainer`)."""
