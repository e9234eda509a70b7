"""The multi-process helpers live in tests/trainer (multiproc_util, the test reward); make them importable here."""

import sys
from pathlib import Path

TRAINER_TESTS = str(Path(__file__).resolve().parents[1] / "trainer")
if TRAINER_TESTS not in sys.path:
    sys.path.insert(0, TRAINER_TESTS)
