"""Policy loading (config group `model`) and the chunked log-prob/entropy pass."""
