"""Helpers shared by the tests and by the scripts their subprocesses run (tests/*/*_ranks.py).

tests/ is on sys.path (pyproject's pytest `pythonpath`; `support.env.pythonpath()` for subprocesses), so a test
imports them as `from support.config import SMALL`. Modules without torch at import time (env, config, metrics, cli)
stay that way: the start-up tests run code that imports them in processes that must not load torch.
"""
