"""Evaluation: sampling-based benchmark metrics (pass@k, mean@n, maj@n) over extracted answers."""
