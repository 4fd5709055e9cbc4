"""``python -m bench.compare`` end to end, small: HEAD~1 against this tree, 2 rounds of SQLite's part 1 with 3 runs.

It checks the shape (every step in the table, both commits in the JSON, the base worktree gone), never a
figure: performance is ``make bench``'s business, and a comparison's verdict is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import compare

ROOT = Path(compare.__file__).resolve().parents[1]
STEPS = {"claim", "start_task", "finish_task", "finish_run", "run"}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_a_small_comparison_with_the_previous_commit(tmp_path: Path) -> None:
    try:
        parent = git("rev-parse", "--verify", "--quiet", "HEAD~1^{commit}")
    except subprocess.CalledProcessError:
        pytest.skip("a shallow clone: HEAD has no parent to compare with")
    worktrees = git("worktree", "list", "--porcelain")
    out = tmp_path / "compare.json"
    argv = ["--base", "HEAD~1", "--rounds", "2", "--only", "sqlite", "--runs", "3", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "bench.compare", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    # 0: two rounds a side can never make a step SLOWER (bench/compare.py), so anything else is a failure.
    assert done.returncode == 0, done.stdout + done.stderr

    result = json.loads(out.read_text())
    assert result["base"]["commit"] == parent and result["base"]["ref"] == "HEAD~1"
    assert result["head"]["commit"] == git("rev-parse", "HEAD") and isinstance(result["head"]["dirty"], bool)
    assert result["base"]["described"].startswith(parent[:7])
    assert result["options"]["order"] == [["base", "head"], ["head", "base"]]
    assert [len(result["rounds"][side]) for side in ("base", "head")] == [2, 2]
    rows = {(r["dialect"], r["mode"], r["step"]): r for r in result["table"]}
    assert set(rows) == {("sqlite", mode, step) for mode in ("fresh", "shared") for step in STEPS}
    assert all(
        r["ratio"] > 0 and r["verdict"] in {"ok", "faster", "within noise", "SLOWER"} for r in rows.values()
    )
    printed = done.stdout.splitlines()
    for dialect, mode, step in rows:
        assert any(line.split()[:3] == [dialect, mode, step] for line in printed), step
    assert git("worktree", "list", "--porcelain") == worktrees  # the base worktree is gone
