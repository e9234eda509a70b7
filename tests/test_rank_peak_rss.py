"""scripts/rank_peak_rss.py --until-first-step: a marked call records the process's VmHWM once, before it runs, and
the generated sitecustomize reaches a child process through the environment."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import rank_peak_rss  # noqa: E402


def test_recording_writes_the_high_water_mark_before_the_first_call_only(tmp_path):
    out, seen = tmp_path / "build_optimizer.rank0", []
    marked = rank_peak_rss.recording(lambda x: seen.append(out.read_text()) or x * 2, out)
    assert marked(3) == 6
    first = out.read_text()
    out.write_text("kept")
    assert marked(4) == 8
    assert seen == [first, "kept"]  # written before the first call, not rewritten by the second
    assert float(first) > 0


def test_hooked_env_loads_the_hook_in_a_child_that_is_not_a_rank(tmp_path):
    env = rank_peak_rss.hooked_env(tmp_path)
    env.pop("RANK", None)
    child = subprocess.run([sys.executable, "-c", "import sys; print(sys.modules['sitecustomize'].__file__)"],
                           env=env, capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(tmp_path / "sitecustomize.py")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sitecustomize.py"]  # no rank: nothing recorded
