"""Run as a main script by test_pool.py: prints whether a reward worker re-ran this file (it must not)."""

from tokenpo.rewards import RewardConfig, RewardScorer, resolve

# seen by rewards_user_fns.main_module_reimported in a worker only if the worker re-ran this file
SPAWN_MAIN_SCRIPT_MARKER = True

if __name__ == "__main__":
    with RewardScorer(resolve(RewardConfig(fn="rewards_user_fns:main_module_reimported"), {})) as scorer:
        print(scorer.score(["x"], ["x"])[0])
