"""The printed report: plain-text tables of the three parts, the targets beside the measured figures, the machine."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import lineage_cost as lineage_part
from bench import scheduler as scheduler_part
from bench import task_cost as task_cost_part
from bench.bookkeeping import OPERATIONS

#: Round-trip budgets per task (statements of the operation itself).
START_TASK_TARGET = 3
FINISH_TASK_TARGET = 1
CLAIM_TARGET = 2
FINISH_RUN_TARGET = 2
CONTENTION_TARGET = 0.40
CONTENTION_TARGET_PROCS = 16
AIRFLOW_TARGET = 1.10
#: Part 7: a full run on years of history costs at most this many times the same run on an empty Engine DB.
HISTORY_TARGET = 1.25
#: Part 8: a claim beside a running purge waits less than this, in seconds.
PURGE_CLAIM_TARGET_S = 1.0
NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A plain-text table; ``align`` has one ``l`` or ``r`` per column (default: first left, rest right)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align, strict=True)
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])]).rstrip()


def _n(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if abs(value - round(value)) < 1e-9:
        return str(int(round(value)))
    return f"{value:.{digits}f}"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT MET")


def _rt(part: dict[str, Any], op: str) -> float:
    return part["fresh"]["round_trips"]["operations"][op]["per_call"]["statements"]


def bookkeeping_section(results: dict[str, dict[str, Any]]) -> str:
    """Part 1: round trips per call, per run, wall times; one column per dialect."""
    dialects = [d for d in ("sqlite", "postgresql") if d in results]
    if not dialects:
        return "1. Bookkeeping of one pipeline run: not measured"
    first = results[dialects[0]]
    names = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    head = (f"1. Bookkeeping of one pipeline run: claim + {first['tasks']} x (start_task + finish_task) + finish_run, "
            f"{first['runs']} runs on fresh run keys")  # fmt: skip
    targets = {
        "start_task": f"<= {START_TASK_TARGET}",
        "finish_task": f"<= {FINISH_TASK_TARGET}",
        "claim": f"<= {CLAIM_TARGET} (PostgreSQL)",
        "finish_run": f"<= {FINISH_RUN_TARGET} (PostgreSQL)",
    }
    rows: list[list[Any]] = []
    for op in OPERATIONS:
        rows.append(
            [f"{op} (statements per call)", *(_n(_rt(results[d], op)) for d in dialects), targets.get(op, "")]
        )
    for d_row, key in (("connect: login/open + setup statements", "per_connection"),):
        rows.append(
            [
                d_row,
                *(_connect_cell(results[d]["fresh"]["round_trips"]["connect"][key]) for d in dialects),
                "",
            ]
        )
    rt = {d: results[d]["fresh"]["round_trips"] for d in dialects}
    rows.append(
        ["connections per run (one per step)", *(_n(rt[d]["connections_per_run"]) for d in dialects), ""]
    )
    rows.append(["round trips per run, steps only", *(_n(sum(rt[d]["per_run"][op] for op in OPERATIONS))
                                                      for d in dialects), ""])  # fmt: skip
    rows.append(
        ["round trips per run, with connections", *(_n(rt[d]["per_run_total"]) for d in dialects), ""]
    )
    for label, mode in (
        ("wall ms per run, connection per step", "fresh"),
        ("wall ms per run, one connection", "shared"),
    ):
        rows.append([f"{label} (median / p95)",
                     *(f"{results[d][mode]['wall_ms']['median']:.1f} / {results[d][mode]['wall_ms']['p95']:.1f}"
                       for d in dialects), ""])  # fmt: skip
    for op in OPERATIONS:
        rows.append([f"  {op} ms, connection per step (median)",
                     *(f"{results[d]['fresh']['op_ms'][op]['median']:.2f}" for d in dialects), ""])  # fmt: skip
    rows.append(["connect ms (median / p95)", *(_connect_ms(rt[d], "connect_ms") for d in dialects), ""])
    rows.append(["close ms (median / p95)", *(_connect_ms(rt[d], "close_ms") for d in dialects), ""])
    checks = []
    for d in dialects:
        check = results[d]["fresh"]["check"]
        if "server" in check:
            verdict = "match" if check["match"] else "MISMATCH"
            checks.append(
                f"  {names[d]}: proxy {check['proxy']} vs {check['method']} {check['server']}: {verdict}"
            )
        else:
            checks.append(f"  {names[d]}: {check['method']} ({check['proxy']})")
    body = table(["", *(names[d] for d in dialects), "target"], rows)
    return "\n".join([head, body, "Counter check (same window):", *checks])


def _connect_cell(per: dict[str, float]) -> str:
    return f"{_n(per.get('connect', 0))} + {_n(per.get('setup', 0))}"


def _connect_ms(rt: dict[str, Any], key: str) -> str:
    ms = rt["connect"][key]
    return "n/a" if ms is None else f"{ms['median']:.2f} / {ms['p95']:.2f}"


def statements_section(results: dict[str, dict[str, Any]], dialect: str = "postgresql") -> str:
    """Where the round trips go: what each operation sends, counted on one dialect."""
    if dialect not in results:
        return ""
    rt = results[dialect]["fresh"]["round_trips"]
    lines = [f"What each call sends ({dialect}, counted):"]
    for op in OPERATIONS:
        sent = rt["operations"][op]["sent_per_call"]
        lines.append(f"  {op}: {_n(sum(sent.values()))}")
        lines.extend(f"    {_n(n)} x {text}" for text, n in sent.items())
    sent = rt["connect"]["sent_per_connection"]
    lines.append(f"  connect: {_n(sum(sent.values()))}")
    lines.extend(f"    {_n(n)} x {text}" for text, n in sent.items())
    return "\n".join(lines)


def _pct(ms: dict[str, float] | None) -> str:
    return "n/a" if not ms else f"{ms['p50']:.1f} / {ms['p99']:.1f}"


def _ratio_cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def contention_section(result: dict[str, Any] | None) -> str:
    """Part 2: one shared pipeline, a connection per step: runs/s, errors, blocking, claim latency, ratios."""
    if not result:
        return "2. Contention on PostgreSQL: not measured"
    head = (f"2. Contention on PostgreSQL: N processes loop full runs of ONE shared pipeline ({result['tasks_per_run']} tasks = "
            f"{result['transactions_per_run']} lifecycle transactions per run),\n"
            f"   each step on its own connection (open, call, close); a BLOCKED claim is retried after "
            f"{result['blocked_sleep_ms']:g} ms; {result['seconds']:g} s per measurement;\n"
            "   baseline = INSERT … RETURNING id, one autocommit transaction on a new connection each "
            "(held: all on one held connection)")  # fmt: skip
    rows = [[r["procs"], f"{r['runs_per_s']:.1f}", _errors_cell(r["errors"]), r["blocked_claims"],
             "n/a" if r["blocked_per_run"] is None else f"{r['blocked_per_run']:.1f}",
             f"{r['lifecycle_tx_per_s']:.0f}", f"{r['baseline_tx_per_s']:.0f}", _ratio_cell(r["ratio"]),
             f">= {CONTENTION_TARGET:.2f}" if r["procs"] == CONTENTION_TARGET_PROCS else "",
             f"{r['baseline_held_tx_per_s']:.0f}", _ratio_cell(r["ratio_held"])]
            for r in result["rows"]]  # fmt: skip
    throughput = table(["processes", "runs/s", "errors", "blocked claims", "blocked/run", "lifecycle tx/s",
                        "baseline tx/s", "÷ baseline", "target", "held baseline tx/s", "÷ held"], rows)  # fmt: skip
    rows = [[r["procs"], _pct(r["claim_wait_ms"]), _pct(r["claim_step_ms"]), _pct(r["claim_call_ms"]),
             r["claim_calls"], _n(r["statements_per_run"]), f"{r['lifecycle_statements_per_s']:.0f}"]
            for r in result["rows"]]  # fmt: skip
    latency = table(["processes", "claim wait ms p50 / p99", "claim step ms p50 / p99", "claim call ms p50 / p99",
                     "claim calls", "stmt/run", "lifecycle stmt/s"], rows)  # fmt: skip
    notes = ("   claim wait: first claim attempt for a run to its successful claim (blocked time included); "
             "claim step: one claim call\n   with its connection open and close, any outcome; claim call: "
             "lc.claim() alone. stmt/run: statements sent per completed run,\n   connection setup and blocked "
             "claims included.")  # fmt: skip
    errors = [
        f"   {name}: {message}" for r in result["rows"] for name, message in r["errors"]["first"].items()
    ]
    return "\n".join(
        [head, throughput, latency, notes, *(["   first error of each type:", *errors] if errors else [])]
    )


def _errors_cell(errors: dict[str, Any]) -> str:
    if not errors["total"]:
        return "0"
    return f"{errors['total']} (" + ", ".join(f"{k} {v}" for k, v in errors["by_type"].items()) + ")"


def credentials_section(result: dict[str, Any] | None) -> str:
    """Part 4: credential calls at the loopback identity providers per pipeline run and per process."""
    if not result:
        return "4. Credential calls (sts, oauth): not measured"
    head = (f"4. Credential calls per pipeline run: each process (fresh, spawned) runs {result['runs_per_process']} runs x "
            f"{result['tasks_per_run']} tasks per variant, a connection per step ({result['connections_per_run']} "
            "per run);\n   calls counted at the loopback STS / OAuth token server (RDS tokens: signings counted in "
            "the process); target <= 1 per process per expiry window")  # fmt: skip
    rows = []
    for r in result["rows"]:
        window = r["window"]
        calls = f"{r['calls']} ({'+'.join(str(c) for c in r['calls_per_process'])})"
        expiry = f"{window['window_s']:g} s"
        if r["variant"] == "sts":
            expiry += f" (token {window['token_window_s']:g} s)"
        rows.append([r["variant"], r["procs"], r["completed_runs"], r["connections"], r["call_name"], calls,
                     f"{r['calls_per_run']:.2f}", r["max_calls_per_process"], r["max_windows"], expiry,
                     "" if r["variant"] != "sts" else
                     f"{r['rds_tokens_signed']} ({'+'.join(str(c) for c in r['rds_tokens_per_process'])})",
                     _errors_cell(r["errors"]), _met(r["met"])])  # fmt: skip
    body = table(["variant", "processes", "runs", "connections", "counted", "calls (per process)", "per run",
                  "max per process", "windows", "expiry window", "RDS tokens signed", "errors", "target"],
                 rows, "lrrrlrrrrlrrl")  # fmt: skip
    lines = [head, body]
    if result.get("server_problems"):
        lines.append("   the servers saw wrong requests: " + "; ".join(result["server_problems"][:5]))
    return "\n".join(lines)


def waits_section(result: dict[str, Any] | None) -> str:
    """Part 6: deferred waits in one triggerer process."""
    if not result:
        return ""
    wake = result["wake_ms"]
    rows = [
        ["deferred waits in one triggerer process", str(result["waits"])],
        ["Engine DB sessions they hold", str(result["sessions"])],
        ["wake after the blocking run's end, ms (median / p99 / max)",
         f"{wake['median']:.0f} / {wake['p99']:.0f} / {wake['max']:.0f}"],
    ]  # fmt: skip
    return "Deferred waits (one triggerer, PostgreSQL, LISTEN)\n" + table(["", "measured"], rows)


def _dialects(results: dict[str, Any] | None) -> list[str]:
    return [d for d in ("postgresql", "sqlite") if d in (results or {})]


def _ms_pair(figures: dict[str, Any]) -> str:
    return f"{figures['history']['median_ms']:.1f} / {figures['empty']['median_ms']:.1f}"


def history_section(results: dict[str, Any] | None) -> str:
    """Part 7: a full run and the CLI's read commands on years of history vs on an empty Engine DB."""
    dialects = _dialects(results)
    if not dialects:
        return ""
    assert results is not None
    lines = [
        "7. History: the same work on an Engine DB with years of history and on an empty one, alternating"
    ]
    for d in dialects:
        r = results[d]
        if "error" in r:
            lines.append(f"   {NAMES[d]}: FAILED: {r['error']}")
            continue
        g = r["generated"]["counts"]
        lines.append(f"   {NAMES[d]}: {g['runs']:,} runs, {g['task_runs']:,} task runs, {g['attempts']:,} attempts "
                     f"(written in {r['generated']['total_s']:.0f} s); {r['repeats']} full runs of {r['pipeline']} "
                     f"per DB (claim + {r['tasks']} x start/end attempt + finish, a connection per step), "
                     f"{r['cli_repeats']} of each CLI command")  # fmt: skip
        rows = [["full run", _ms_pair(r["run"]), _ratio_cell(r["run"]["ratio"]), f"<= {HISTORY_TARGET:.2f}"]]
        rows += [[f"  {op}", _ms_pair(v), _ratio_cell(v["ratio"]), ""] for op, v in r["ops"].items()]
        rows += [[f"CLI {name}", _ms_pair(v), _ratio_cell(v["ratio"]), ""] for name, v in r["cli"].items()]
        lines.append(table([f"{NAMES[d]}", "median ms history / empty", "history ÷ empty", "target"], rows))
    return "\n".join(lines)


def purge_section(results: dict[str, Any] | None) -> str:
    """Part 8: purge throughput and the claim times beside it."""
    dialects = _dialects(results)
    if not dialects:
        return ""
    assert results is not None
    lines = ["8. Purge of that history in its own process (etl-craft-airflow purge), another process claiming and "
             "finishing runs beside it"]  # fmt: skip
    rows = []
    for d in dialects:
        r = results[d]
        if "error" in r:
            lines.append(f"   {NAMES[d]}: FAILED: {r['error']}")
            continue
        c, alone, during = r["counts"], r["claims_alone"], r["claims_during"]
        rows.append([NAMES[d], f"{r['older_than_days']}d / {r['batch_size']}", f"{c['RUNS_DELETED']:,}",
                     f"{c['ATTEMPTS_DELETED']:,}", r["batches"], f"{r['purge_s']:.1f}", f"{r['runs_per_s']:,.0f}",
                     f"{r['attempts_per_s']:,.0f}", _claims_cell(during), _claims_cell(alone),
                     f"< {PURGE_CLAIM_TARGET_S * 1000:.0f} ms"])  # fmt: skip
    if rows:
        lines.append(table(["", "older than / batch", "runs deleted", "attempts deleted", "batches", "s",
                            "runs/s", "attempts/s", "claims during: n, median / max ms",
                            "claims alone: n, median / max ms", "target (max)"], rows))  # fmt: skip
    return "\n".join(lines)


def _claims_cell(ms: dict[str, Any]) -> str:
    return "none" if not ms["n"] else f"{ms['n']}, {ms['median_ms']:.1f} / {ms['max_ms']:.0f}"


def airflow_section(result: dict[str, Any] | None) -> str:
    """Part 3: dag.test() times of the plain and the recorded DAG."""
    if not result:
        return "3. Airflow-level overhead: not measured"
    if "error" in result:
        return f"3. Airflow-level overhead: FAILED: {result['error']}"
    head = (f"3. Airflow-level overhead: dag.test() of {result['tasks']} chained tasks, plain @task vs @etl_craft_task in "
            f"etl_craft_pipeline\n   (+ claim and finish; SQLite Engine DB), {result['repeats']} alternating runs "
            "each after one warm-up")  # fmt: skip
    rows = [
        ["plain", f"{result['plain_median_s']:.2f}", " ".join(f"{t:.2f}" for t in result["plain_s"]), ""],
        [
            "recorded",
            f"{result['recorded_median_s']:.2f}",
            " ".join(f"{t:.2f}" for t in result["recorded_s"]),
            "",
        ],
        [
            "recorded / plain",
            f"{result['ratio']:.2f}x",
            f"+{result['extra_ms_per_task']:.0f} ms per task",
            f"<= {AIRFLOW_TARGET:.2f}x",
        ],
    ]
    extra = (
        f"   (the recorded DAG runs {result['tasks'] + 2} tasks: a plain task costs "
        f"{result['plain_ms_per_task']:.0f} ms, so claim + finish alone would be about "
        f"{2 * result['plain_ms_per_task'] / 1000:.2f} s of the difference — an estimate, not measured)"
    )
    return f"{head}\n" + table(["DAG", "median s", "runs (s)", "target"], rows, "lrll") + f"\n{extra}"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with what was measured and whether it is met."""
    out: list[dict[str, Any]] = []
    book = results.get("bookkeeping", {})
    for dialect, name in (("postgresql", "PostgreSQL"), ("sqlite", "SQLite")):
        if dialect not in book:
            continue
        rt = book[dialect]["fresh"]["round_trips"]
        conn = rt["connect"]["per_connection"]["total"]
        budgets = [("start_task", START_TASK_TARGET), ("finish_task", FINISH_TASK_TARGET)]
        if dialect == "postgresql":  # issue 17: claim and finish in at most two round trips on PostgreSQL
            budgets += [("claim", CLAIM_TARGET), ("finish_run", FINISH_RUN_TARGET)]
        for op, budget in budgets:
            own = _rt(book[dialect], op)
            out.append({
                "target": f"{op} <= {budget} round trip{'s' if budget > 1 else ''}"
                + (" per task" if op.endswith("_task") else "") + f" ({name})",
                "measured": f"{_n(own)} (+ {_n(conn)} for the connection each operator step opens)",
                "value": own, "met": own <= budget,
            })  # fmt: skip
    contention = results.get("contention")
    if contention:
        row = next((r for r in contention["rows"] if r["procs"] == CONTENTION_TARGET_PROCS), None)
        ratio = None if row is None else row["ratio"]
        out.append({
            "target": f"contention throughput >= {CONTENTION_TARGET:.0%} of baseline at {CONTENTION_TARGET_PROCS} processes",
            "measured": "not measured at 16 processes" if ratio is None else
            f"{ratio:.1%} (lifecycle tx/s ÷ baseline tx/s; one shared pipeline, a connection per step and per insert)",
            "value": ratio, "met": None if ratio is None else ratio >= CONTENTION_TARGET,
        })  # fmt: skip
        errors = sum(r["errors"]["total"] for r in contention["rows"])
        out.append({"target": "contention: no errors in any step", "measured": f"{errors} errors",
                    "value": errors, "met": errors == 0})  # fmt: skip
    cred_rows = (results.get("credentials") or {}).get("rows", [])
    for variant in dict.fromkeys(r["variant"] for r in cred_rows):
        rows = [r for r in cred_rows if r["variant"] == variant]
        worst = max(r["max_calls_per_process"] for r in rows)
        out.append({
            "target": f"{variant}: <= 1 {rows[0]['call_name'][:-1]} per process per expiry window",
            "measured": f"at most {worst} per process over "
            + ", ".join(f"{r['max_windows']} window(s) with {r['procs']} proc" for r in rows)
            + f"; {max(r['calls_per_run'] for r in rows):.2f} per run",
            "value": worst, "met": all(r["met"] for r in rows),
        })  # fmt: skip
    waits = results.get("waits")
    if waits:
        wake = waits["wake_ms"]
        out.append({
            "target": "1,000 deferred waits in one triggerer hold <= 3 Engine DB sessions",
            "measured": f"{waits['sessions']} for {waits['waits']} waits",
            "value": waits["sessions"], "met": waits["sessions"] <= 3,
        })  # fmt: skip
        out.append({
            "target": "each wait wakes within 1 s (median) and 2 s (p99) of its blocking run's end",
            "measured": f"{wake['median'] / 1000:.2f} s / {wake['p99'] / 1000:.2f} s",
            "value": wake["p99"], "met": wake["median"] <= 1000 and wake["p99"] <= 2000,
        })  # fmt: skip
    for d in _dialects(results.get("history")):
        r = results["history"][d]
        if "error" in r:
            out.append({"target": f"a full run on years of history <= {HISTORY_TARGET:.2f}x on an empty Engine DB "
                        f"({NAMES[d]})", "measured": f"FAILED: {r['error']}", "value": None, "met": False})  # fmt: skip
            continue
        ratio = r["run"]["ratio"]
        out.append({
            "target": f"a full run with {r['generated']['counts']['attempts']:,} attempts of history <= "
            f"{HISTORY_TARGET:.2f}x on an empty Engine DB ({NAMES[d]})",
            "measured": f"{ratio:.2f}x ({r['run']['history']['median_ms']:.1f} / {r['run']['empty']['median_ms']:.1f} ms)",
            "value": ratio, "met": ratio <= HISTORY_TARGET,
        })  # fmt: skip
    for d in _dialects(results.get("purge")):
        r = results["purge"][d]
        target = f"a claim beside a running purge waits < {PURGE_CLAIM_TARGET_S:g} s ({NAMES[d]})"
        if "error" in r:
            out.append({"target": target, "measured": f"FAILED: {r['error']}", "value": None, "met": False})
            continue
        during = r["claims_during"]
        if not during["n"]:
            out.append(
                {"target": target, "measured": "no claim ran during the purge", "value": None, "met": None}
            )
            continue
        out.append({
            "target": target,
            "measured": f"longest {during['max_ms']:.0f} ms of {during['n']} claims (median {during['median_ms']:.1f} ms; "
            f"{r['claims_alone']['median_ms']:.1f} ms without a purge); {r['runs_per_s']:,.0f} runs/s, "
            f"{r['attempts_per_s']:,.0f} attempts/s deleted",
            "value": during["max_ms"], "met": during["max_ms"] < PURGE_CLAIM_TARGET_S * 1000,
        })  # fmt: skip
    airflow = results.get("airflow")
    if airflow and "ratio" in airflow:
        out.append({
            "target": f"recorded DAG <= {AIRFLOW_TARGET:.2f}x the plain one",
            "measured": f"{airflow['ratio']:.2f}x", "value": airflow["ratio"], "met": airflow["ratio"] <= AIRFLOW_TARGET,
        })  # fmt: skip
    out += scheduler_part.targets(results.get("scheduler"))
    out += task_cost_part.targets(results.get("task_cost"))
    out += lineage_part.targets(results.get("lineage"))
    return out


def targets_section(items: list[dict[str, Any]]) -> str:
    return "Targets\n" + table(["target", "measured", "verdict"], [[t["target"], t["measured"], _met(t["met"])]
                                                              for t in items], "lll")  # fmt: skip


def machine_section(m: dict[str, Any]) -> str:
    pg = f"PostgreSQL {m['postgresql']}" if m.get("postgresql") else "PostgreSQL not measured"
    return "\n".join([
        "Machine",
        f"  CPUs: {m['cpu_count']} ({m['cpu_model'] or 'model unknown'}); {m['platform']}",
        f"  Python {m['python']}, SQLite {m['sqlite']}, psycopg2 {m['psycopg2']}, Airflow {m['airflow']}",
        f"  {pg} (throwaway cluster on 127.0.0.1: {m['postgresql_settings']})",
        *_load(m.get("load_average")),
    ])  # fmt: skip


def _load(load: dict[str, Sequence[float]] | None) -> list[str]:
    """The load averages around the run: other work on the machine skews every figure above."""
    if not load:
        return []
    start, end = load["at_start"], load["at_end"]
    return [f"  load average (1/5/15 min): {' '.join(f'{x:.2f}' for x in start)} at start, "
            f"{' '.join(f'{x:.2f}' for x in end)} at end"]  # fmt: skip


def task_cost_section(result: dict[str, Any] | None) -> str:
    """Part 9's tables (:func:`bench.task_cost.render`), where it ran."""
    return task_cost_part.render(result) if result and "error" not in result else ""


def render(results: dict[str, Any]) -> str:
    """The whole printed report."""
    parts = [
        f"etl-craft bookkeeping benchmark ({results['mode']} run of {results.get('commit', 'an unknown commit')}, "
        f"{results['started']}, took {results['took_s']:.0f} s)",
        bookkeeping_section(results.get("bookkeeping", {})),
        statements_section(results.get("bookkeeping", {})),
        contention_section(results.get("contention")),
        airflow_section(results.get("airflow")),
        credentials_section(results.get("credentials")),
        waits_section(results.get("waits")),
        history_section(results.get("history")),
        purge_section(results.get("purge")),
        scheduler_part.section(results.get("scheduler"), table),
        task_cost_section(results.get("task_cost")),
        lineage_part.section(results.get("lineage")),
        targets_section(results.get("targets", [])),
        machine_section(results["machine"]),
    ]
    return "\n\n".join(p for p in parts if p)


#: The generated block of docs/benchmarks.md, which ``python -m bench.report --page docs/benchmarks.md`` rewrites.
REPORT_PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
REPORT_BEGIN = "<!-- bench-report:begin (python -m bench.report --page docs/benchmarks.md) -->"
REPORT_END = "<!-- bench-report:end -->"


def page_block(results: dict[str, Any]) -> str:
    """The Performance figures of docs/benchmarks.md from ``results``: the targets as a Markdown table, then
    the whole printed report (so the page says exactly what ``bench/results.json`` holds)."""
    rows = "\n".join(
        f"| {t['target']} | {t['measured']} | {_met(t['met'])} |".replace("<=", "≤").replace(">=", "≥")
        for t in results.get("targets", [])
    )
    return "\n".join(
        [
            REPORT_BEGIN,
            f"Measured by `make bench` at commit {results.get('commit', 'unknown')} ({results['started']}, "
            f"{results['took_s']:.0f} s); `bench/results.json` holds it all.",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
            rows,
            "",
            "<details><summary>The whole report</summary>",
            "",
            "```text",
            render(results),
            "```",
            "",
            "</details>",
            REPORT_END,
        ]
    )


def rewrite_page(page: Path, results: dict[str, Any]) -> None:
    """Replace the block between :data:`REPORT_BEGIN` and :data:`REPORT_END` in ``page``."""
    text = page.read_text(encoding="utf-8")
    start, end = text.find(REPORT_BEGIN), text.find(REPORT_END)
    if start < 0 or end < start:
        raise SystemExit(f"{page} has no {REPORT_BEGIN} … {REPORT_END} block")
    page.write_text(text[:start] + page_block(results) + text[end + len(REPORT_END) :], encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report [--results bench/results.json] [--page docs/benchmarks.md]``: print the report
    of a results file, or rewrite the generated block of the benchmarks page from it."""
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument(
        "--page", type=Path, help=f"rewrite this page's bench-report block (the docs' is {REPORT_PAGE.name})"
    )
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text(encoding="utf-8"))
    if args.page:
        rewrite_page(args.page, results)
    else:
        print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
