"""``python -m bench.compare``'s arithmetic: figures from a bench results file, ABBA order, table and verdicts.

Synthetic per-round medians stand for the bench runs; no benchmark runs here.
"""

from __future__ import annotations

from itertools import combinations

import pytest

from bench import compare
from bench.compare import Figures

BASE = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 10.1]
#: ±30% round to round, as one bench run varies on the 2-core machine.
NOISY_BASE = [10.0, 13.0, 7.5, 11.5, 8.5, 12.5, 9.0, 10.5]


def rounds(values: list[float], step: str = "claim") -> list[Figures]:
    return [{"sqlite": {"fresh": {step: v}}} for v in values]


def only_row(base: list[float], head: list[float]) -> compare.Row:
    (row,) = compare.table(rounds(base), rounds(head))
    return row


def test_figures_are_each_steps_median_and_the_whole_runs() -> None:
    def part(scale: float) -> dict[str, object]:
        ops = {op: {"median": scale * i, "p95": 99.0} for i, op in enumerate(("claim", "start_task"), 1)}
        return {"op_ms": ops, "wall_ms": {"median": scale * 10, "p95": 99.0}, "round_trips": {}}

    results = {"bookkeeping": {"sqlite": {"fresh": part(1.0), "shared": part(0.5), "dialect": "sqlite"}}}
    assert compare.figures(results) == {
        "sqlite": {
            "fresh": {"claim": 1.0, "start_task": 2.0, "run": 10.0},
            "shared": {"claim": 0.5, "start_task": 1.0, "run": 5.0},
        }
    }


def test_the_order_alternates_each_round() -> None:
    assert compare.order(4) == [("base", "head"), ("head", "base"), ("base", "head"), ("head", "base")]


def test_the_same_figures_are_ok() -> None:
    row = only_row(BASE, BASE)
    assert row.ratio == 1.0 and row.verdict == "ok"
    assert (row.base_ms, row.base_min, row.base_max) == (10.05, 9.8, 10.3)
    assert compare.exit_status([row]) == 0


def test_a_clearly_slower_step_fails() -> None:
    row = only_row(BASE, [v * 1.2 for v in reversed(BASE)])
    assert row.ratio is not None and abs(row.ratio - 1.2) < 1e-9
    assert row.p_slower == 1 / 12870  # every head round above every base round x 1.05: 1 of C(16, 8) orders
    assert row.verdict == "SLOWER" and compare.exit_status([row]) == 1


def test_a_ratio_over_the_limit_inside_the_noise_does_not_fail() -> None:
    row = only_row(NOISY_BASE, [v * 1.08 for v in reversed(NOISY_BASE)])
    assert row.ratio is not None and row.ratio > compare.LIMIT
    assert row.p_slower is not None and row.p_slower >= compare.ALPHA
    assert row.verdict == "within noise" and compare.exit_status([row]) == 0


def test_a_clearly_faster_step_is_named() -> None:
    assert only_row(BASE, [v * 0.8 for v in BASE]).verdict == "faster"


def test_two_rounds_can_never_prove_a_step_slower() -> None:
    row = only_row([10.0, 10.1], [20.0, 20.1])
    assert row.ratio is not None and row.ratio > 1.9
    assert row.p_slower == 1 / 6 and row.verdict == "within noise"
    assert only_row(BASE[:4], [20.0, 20.1, 20.2, 20.3]).p_slower == 1 / 70


def test_the_exact_p_is_the_share_of_all_splits_of_the_pooled_rounds() -> None:
    """Against brute force: each way to deal the pooled values into two sides, as likely as any other."""
    high, low = [10.4, 12.0, 9.1, 13.3, 11.8], [10.0, 9.5, 11.0, 8.7]
    limit = 1.05
    pooled = [(v, "high") for v in high] + [(v * limit, "low") for v in low]  # compare on the same scale
    values = [v for v, _ in pooled]
    observed = sum(h > limit * lo for h in high for lo in low)
    splits = list(combinations(range(len(values)), len(high)))
    as_large = sum(
        sum(values[i] > values[j] for i in chosen for j in set(range(len(values))) - set(chosen)) >= observed
        for chosen in splits
    )
    assert compare.exceed_p(high, low, limit) == pytest.approx(as_large / len(splits))


def test_a_step_on_one_side_only_has_no_ratio() -> None:
    rows = compare.table(rounds(BASE), rounds(BASE) + rounds([5.0], "new_step"))
    assert [(r.step, r.verdict) for r in rows] == [("claim", "ok"), ("new_step", "n/a")]
    assert compare.exit_status(rows) == 0


def test_the_table_has_a_line_per_step_with_spread_and_verdict() -> None:
    base = [{"sqlite": {"fresh": {"claim": v, "run": 10 * v}}} for v in BASE]
    head = [{"sqlite": {"fresh": {"claim": 1.2 * v, "run": 10 * v}}} for v in BASE]
    text = compare.render(compare.table(base, head), "aaaa", "bbbb")
    header, rule, claim, run = text.splitlines()
    assert header.split()[:4] == ["dialect", "mode", "step", "base"] and "(aaaa)" in header
    assert set(rule.replace(" ", "")) == {"-"}
    assert claim.split()[:3] == ["sqlite", "fresh", "claim"] and "9.80–10.30" in claim
    assert claim.endswith("SLOWER") and run.endswith("ok") and "1.000" in run
