"""``python -m bench.compare --base REF`` (``make bench-compare BASE=REF``): is this tree slower than REF?

Part 1's step times (claim, start_task, finish_task, finish_run, and the whole run) of two commits, measured
interleaved on the same machine: a throwaway ``git worktree`` of REF (detached, in a temporary directory,
removed at the end, also on Ctrl-C or failure) and this tree each run ``python -m bench --only PARTS`` with
their own tree first on ``PYTHONPATH`` and this interpreter, ``--rounds`` times, the order alternating each
round (base-head, head-base, ...: ABBA), so drift in the machine's load falls on both sides alike.

Each bench run gives one median per dialect, mode and step; a side's figure is the **median of its per-round
medians**, and the ratio is head ÷ base. The project's rule (docs/benchmarks.md, "Comparing two commits") is
that no step gets more than 5% slower (``LIMIT``), but one run on this 2-core machine varies by ±30%, so a
ratio above the limit is judged against the noise with a one-sided **exact Mann–Whitney U test** (no scipy
in the pinned constraints; a few lines with the stdlib): are head's per-round medians larger than 1.05 × base's
more often than chance would make them? ``p(>1.05x)`` in the table is that chance. Rank-based and exact, it
needs no assumption about the distributions and stays honest with few rounds: with 2 rounds a side no split
can reach p < 0.05 (the smallest p is 1/6), with 4 only a clean one can (1/70), with 8 most real shifts do.
Verdicts (``ALPHA`` = 0.05):

* ``ok``: ratio ≤ 1.05.
* ``within noise``: ratio > 1.05, but p ≥ 0.05: the rounds overlap too much to say the step got more than 5%
  slower (more ``--rounds`` tell better).
* ``SLOWER``: ratio > 1.05 and p < 0.05. Any such step makes the exit status 1.
* ``faster``: ratio < 1 ÷ 1.05 and the mirrored test (base's medians larger than 1.05 × head's) gives p < 0.05.

Exit status: 0, or 1 when a step is ``SLOWER`` (so it can gate); 2 when a bench run or git failed, 130 when
interrupted (no table then).

The table also shows each side's spread (min–max of its per-round medians). The JSON (``--out``, default
``bench/compare-results.json``, not committed: it is about a pair of commits on one machine at one time)
holds both commits, whether the head tree had uncommitted changes, the options, every round's medians and
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache
from math import comb
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().with_name("compare-results.json")
LIMIT = 1.05
ALPHA = 0.05
WHOLE_RUN = "run"
#: dialect -> mode -> step -> median ms of one bench run
Figures = dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True)
class Row:
    """One line of the table: a step of one dialect and mode, both sides' rounds summed up."""

    dialect: str
    mode: str
    step: str
    base_ms: float | None
    head_ms: float | None
    ratio: float | None
    base_min: float | None
    base_max: float | None
    head_min: float | None
    head_max: float | None
    p_slower: float | None
    verdict: str


def figures(results: dict[str, Any]) -> Figures:
    """The medians of one ``python -m bench`` results file: each step's, and the whole run's as ``run``."""
    found: Figures = {}
    for dialect, part in results["bookkeeping"].items():
        for mode in ("fresh", "shared"):
            steps = {op: float(v["median"]) for op, v in part[mode]["op_ms"].items()}
            steps[WHOLE_RUN] = float(part[mode]["wall_ms"]["median"])
            found.setdefault(dialect, {})[mode] = steps
    return found


def order(rounds: int) -> list[tuple[str, str]]:
    """The sides' order in each round: base first in even rounds, head first in odd ones (ABBA)."""
    return [("base", "head") if i % 2 == 0 else ("head", "base") for i in range(rounds)]


def exceed_p(high: Sequence[float], low: Sequence[float], limit: float) -> float:
    """One-sided exact Mann–Whitney p: how likely ``high`` beats ``limit`` × ``low`` this often by chance.

    U counts the pairs ``(h, l)`` with ``h > limit * l`` (a tie counts for nothing, which only raises p); under
    the hypothesis that both are samples of one distribution, every ordering of the pooled values is equally
    likely, and the number with U = k for sizes (i, j) follows from where the largest value falls.
    """

    @cache
    def ways(i: int, j: int, k: int) -> int:
        if k < 0 or k > i * j:
            return 0
        if i == 0 or j == 0:
            return 1
        return ways(i - 1, j, k - j) + ways(i, j - 1, k)  # the largest is one of high's, or one of low's

    u = sum(h > limit * lo for h in high for lo in low)
    m, n = len(high), len(low)
    return sum(ways(m, n, k) for k in range(u, m * n + 1)) / comb(m + n, m)


def verdict(
    ratio: float, p_slower: float, p_faster: float, limit: float = LIMIT, alpha: float = ALPHA
) -> str:
    """The module docstring's rule."""
    if ratio <= limit:
        return "faster" if ratio < 1 / limit and p_faster < alpha else "ok"
    return "SLOWER" if p_slower < alpha else "within noise"


def _summary(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """Median, min and max of a side's per-round medians (``None`` for a step that side never measured)."""
    return (statistics.median(values), min(values), max(values)) if values else (None, None, None)


def table(base_rounds: Sequence[Figures], head_rounds: Sequence[Figures]) -> list[Row]:
    """A row per dialect, mode and step seen on either side (in the order the results list them)."""
    keys: dict[tuple[str, str, str], None] = {}
    for fig in (*base_rounds, *head_rounds):
        for dialect, modes in fig.items():
            for mode, steps in modes.items():
                keys.update(dict.fromkeys((dialect, mode, step) for step in steps))
    rows = []
    for dialect, mode, step in keys:
        base, head = (
            [f[dialect][mode][step] for f in side if step in f.get(dialect, {}).get(mode, {})]
            for side in (base_rounds, head_rounds)
        )
        (b, b_min, b_max), (h, h_min, h_max) = _summary(base), _summary(head)
        if b is None or h is None or b <= 0:
            rows.append(Row(dialect, mode, step, b, h, None, b_min, b_max, h_min, h_max, None, "n/a"))
            continue
        ratio = h / b
        p_slower, p_faster = exceed_p(head, base, LIMIT), exceed_p(base, head, LIMIT)
        rows.append(Row(dialect, mode, step, b, h, ratio, b_min, b_max, h_min, h_max, p_slower,
                        verdict(ratio, p_slower, p_faster)))  # fmt: skip
    return rows


def exit_status(rows: Sequence[Row]) -> int:
    """1 when a step is slower beyond the noise rule, else 0."""
    return 1 if any(row.verdict == "SLOWER" for row in rows) else 0


def render(rows: Sequence[Row], base_label: str, head_label: str) -> str:
    """The table as text: medians of per-round medians, their min–max, ratio, p and verdict."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    def pair(low: float | None, high: float | None) -> str:
        return "-" if low is None or high is None else f"{low:.2f}–{high:.2f}"

    lines = [("dialect", "mode", "step", f"base ms ({base_label})", "min–max", f"head ms ({head_label})",
              "min–max", "head/base", f"p(>{LIMIT}x)", "verdict")]  # fmt: skip
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        p = "-" if r.p_slower is None else f"{r.p_slower:.3f}"
        lines.append((r.dialect, r.mode, r.step, ms(r.base_ms), pair(r.base_min, r.base_max), ms(r.head_ms),
                      pair(r.head_min, r.head_max), ratio, p, r.verdict))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = []
    for line in lines:
        cells = [
            cell.ljust(w) if i < 3 or i == 9 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        text.append("  ".join(cells).rstrip())
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


# --- running the two trees ------------------------------------------------------------------------------------


def git(*args: str, cwd: Path = ROOT) -> str:
    """A git command's output (``CalledProcessError`` when it fails)."""
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@contextmanager
def base_worktree(ref: str, tmp: Path) -> Iterator[Path]:
    """A detached worktree of ``ref`` under ``tmp``, removed from disk and from git's list however this ends."""
    tree = tmp / "base"
    git("worktree", "add", "--detach", "--quiet", str(tree), ref)
    try:
        yield tree
    finally:
        removed = subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True
        )
        if (
            removed.returncode != 0
        ):  # e.g. its directory went first: forget the entries whose directory is gone
            shutil.rmtree(tree, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


def run_bench(tree: Path, out: Path, log: Path, bench_args: Sequence[str]) -> dict[str, Any]:
    """``python -m bench`` in ``tree`` (first on the path, and the working directory), its output to ``log``."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    )
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "bench", *bench_args, "--out", str(out)], cwd=tree,
                                env=env, stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            code = proc.wait()
        except BaseException:
            # Interrupted: let the bench stop its PostgreSQL cluster and work directory itself.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"python -m bench in {tree} exited {code}:\n{tail}")
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base", required=True, help="git ref of the base commit (e.g. main, HEAD~1, 2431edc)"
    )
    parser.add_argument("--rounds", type=int, default=8, help="bench runs of each side, ABBA (default 8)")
    parser.add_argument("--only", default="sqlite,postgresql", help="bench parts (default %(default)s)")
    parser.add_argument(
        "--runs", type=int, help="part 1: pipeline runs per dialect and mode (bench's default)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        base_commit = git("rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}")
    except subprocess.CalledProcessError:
        print(f"error: --base {args.base}: no such commit", file=sys.stderr)
        return 2
    head_commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain"))
    bench_args = ["--only", args.only, *(["--runs", str(args.runs)] if args.runs else [])]
    head_label = f"{head_commit[:10]}{'+dirty' if dirty else ''}"
    print(f"base {args.base} = {base_commit[:10]}, head {head_label}: {args.rounds} rounds of "
          f"python -m bench {' '.join(bench_args)}, ABBA", flush=True)  # fmt: skip
    previous = signal.signal(signal.SIGTERM, _interrupt)
    rounds: dict[str, list[Figures]] = {"base": [], "head": []}
    described: dict[str, str] = {}  # each side's bench run names the commit it measured (git describe)
    tmp = Path(tempfile.mkdtemp(prefix="etl-craft-compare-"))
    try:
        with base_worktree(base_commit, tmp) as base_tree:
            trees = {"base": base_tree, "head": ROOT}
            for i, sides in enumerate(order(args.rounds)):
                took = []
                for side in sides:
                    started = time.perf_counter()
                    out, log = tmp / f"{side}-{i}.json", tmp / f"{side}-{i}.log"
                    results = run_bench(trees[side], out, log, bench_args)
                    rounds[side].append(figures(results))
                    described[side] = str(results.get("commit"))
                    took.append(f"{side} {time.perf_counter() - started:.0f} s")
                print(f"round {i + 1}/{args.rounds}: {', '.join(took)}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the base worktree and temporary files are removed", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
    rows = table(rounds["base"], rounds["head"])
    status = exit_status(rows)
    text = render(rows, base_commit[:10], head_label)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "base": {"ref": args.base, "commit": base_commit, "described": described.get("base")},
        "head": {"commit": head_commit, "dirty": dirty, "described": described.get("head")},
        "options": {"rounds": args.rounds, "only": args.only, "runs": args.runs, "order": order(args.rounds)},
        "rule": {"limit": LIMIT, "alpha": ALPHA, "test": "one-sided exact Mann-Whitney U, head vs limit x base"},
        "rounds": rounds,
        "table": [asdict(row) for row in rows],
        "report": text,
        "exit_status": status,
    }, indent=2) + "\n")  # fmt: skip
    print()
    print(text)
    print(f"\nresults written to {args.out}")
    if status:
        print(
            f"error: a step is more than {LIMIT - 1:.0%} slower beyond the noise (verdict SLOWER)",
            file=sys.stderr,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
