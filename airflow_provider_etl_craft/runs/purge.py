"""Retention: delete finished runs older than a cutoff, with everything that hangs off them (docs/retention.md).

The purge never deletes what a gate or a claim still reads. A run is *kept* when it is QUEUED or IN-PROGRESS,
waits for a repair (``REPAIR_PENDING='Y'``), is the newest run of its pipeline, is the newest finished
non-backfill run of its pipeline (what an upstream gate reads, with its task runs for HAS_DATA), or is named
by the newest consumption row of a dependency edge (the consumed run, and the consuming run that row belongs
to). A run that a kept run's gate decision or consumption row points at is kept too, and so on transitively,
so no foreign key of a kept row ever dangles.

Everything else that ended before the cutoff goes, in batches of ``batch_size`` runs, each batch one short
transaction: re-check the batch, archive its rows (``--archive``), delete them children first, add the counts
to the purge's ``AUD_ENGINE_PURGES`` row, commit. The append-only tables accept the delete only inside such a
batch (ENGINE 0005). A killed purge leaves only whole batches behind; the next one marks its row INTERRUPTED
and continues.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from airflow_provider_etl_craft.engine import actor
from airflow_provider_etl_craft.engine.dbapi import Connection, Cursor
from airflow_provider_etl_craft.engine.dialects import EngineDialect
from airflow_provider_etl_craft.engine.schema import require_current
from airflow_provider_etl_craft.errors import (
    ConfigurationError,
    LockTimeoutError,
    MetadataError,
    RunStateError,
)
from airflow_provider_etl_craft.runs.vocabulary import ENDED_RUN, ENDED_RUN_SQL, PurgeStatus

FINISHED = ENDED_RUN
#: The tables a purge deletes from, in the order it deletes (children before parents), with their keys.
TABLES: tuple[tuple[str, str], ...] = (
    ("AUD_DEPENDENCY_CONSUMPTION", "CONSUMPTION_ID"),
    ("AUD_GATE_DECISIONS", "DECISION_ID"),
    ("AUD_RUN_INTERVENTIONS", "INTERVENTION_ID"),
    ("AUD_TASK_ATTEMPTS", "ATTEMPT_ID"),
    ("AUD_TASK_RUN_LOG", "TASK_RUN_ID"),
    ("AUD_PIPELINES_RUN_LOG", "PIPELINE_RUN_ID"),
    ("AUD_PIPELINE_PAUSES", "PIPELINE_PAUSE_ID"),
)
#: ``AUD_ENGINE_PURGES`` count column per table.
COUNT_COLUMNS = {
    "AUD_PIPELINES_RUN_LOG": "RUNS_DELETED",
    "AUD_TASK_RUN_LOG": "TASK_RUNS_DELETED",
    "AUD_TASK_ATTEMPTS": "ATTEMPTS_DELETED",
    "AUD_GATE_DECISIONS": "GATE_DECISIONS_DELETED",
    "AUD_DEPENDENCY_CONSUMPTION": "CONSUMPTIONS_DELETED",
    "AUD_PIPELINE_PAUSES": "PAUSES_DELETED",
    "AUD_RUN_INTERVENTIONS": "INTERVENTIONS_DELETED",
}
DEFAULT_BATCH_SIZE = 500
MAX_BATCH_SIZE = 5000
#: A RUNNING purge whose heartbeat is older than this is taken as dead (another host's, whose pid we cannot test).
STALE_AFTER = timedelta(minutes=10)
#: How often a batch whose runs changed under it (a new reference, a reopened run) is planned again.
REPLANS = 5
MANIFEST = "MANIFEST.sha256"
#: SQLite: seconds between two batches at least (and no less than the batch took). SQLite has one write lock
#: and a waiting writer polls for it every 100 ms at most, so a pause this long lets every waiting claim in
#: before the next batch; back to back, batches could starve it.
SQLITE_PAUSE = 0.1
#: Seconds one batch's transaction should take at most. A batch holds its runs' rows, and on SQLite the one write
#: lock, for its whole transaction, so the purge sizes its batches to this instead of trusting a run count:
#: runs differ in size (a 20-task run with retries has a hundred rows), and a loaded server is slower. It starts
#: at :data:`FIRST_BATCH` runs, shrinks a batch that took longer in proportion, and doubles one that took under a
#: quarter of it, never above ``batch_size``. Claims beside a purge then wait at most about this long.
BATCH_BUDGET = 0.25
FIRST_BATCH = 50

#: Runs a gate or claim still reads, whatever their age (see the module docstring).
_PROTECTED = (
    "SELECT MAX(PIPELINE_RUN_ID) FROM AUD_PIPELINES_RUN_LOG GROUP BY PIPELINE_ID "  # noqa: S608 - constant SQL
    "UNION SELECT MAX(PIPELINE_RUN_ID) FROM AUD_PIPELINES_RUN_LOG WHERE BACKFILL = 'N' "
    f"AND STATUS IN {ENDED_RUN_SQL} GROUP BY PIPELINE_ID "
    "UNION SELECT c.CONSUMED_PIPELINE_RUN_ID FROM AUD_DEPENDENCY_CONSUMPTION c WHERE c.CONSUMPTION_ID IN "
    "(SELECT MAX(CONSUMPTION_ID) FROM AUD_DEPENDENCY_CONSUMPTION GROUP BY PIPELINE_DEPENDENCY_ID, TASK_DEPENDENCY_ID) "
    "UNION SELECT c.PIPELINE_RUN_ID FROM AUD_DEPENDENCY_CONSUMPTION c WHERE c.CONSUMPTION_ID IN "
    "(SELECT MAX(CONSUMPTION_ID) FROM AUD_DEPENDENCY_CONSUMPTION GROUP BY PIPELINE_DEPENDENCY_ID, TASK_DEPENDENCY_ID)"
)
#: Of the runs ``{ids}``, those :data:`_PROTECTED` names, asked run by run through indexes (the newest-run
#: index, the consumption rows of the run), so a batch's re-check costs the same whatever the history: newest of
#: its pipeline, newest finished non-backfill one, or either run of an edge's newest consumption.
_PROTECTED_AMONG = (
    "SELECT r.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r WHERE r.PIPELINE_RUN_ID IN {ids} AND ("  # noqa: S608 - constant SQL
    "NOT EXISTS (SELECT 1 FROM AUD_PIPELINES_RUN_LOG n WHERE n.PIPELINE_ID = r.PIPELINE_ID "
    "AND n.PIPELINE_RUN_ID > r.PIPELINE_RUN_ID) "
    f"OR (r.BACKFILL = 'N' AND r.STATUS IN {ENDED_RUN_SQL} AND NOT EXISTS (SELECT 1 "
    "FROM AUD_PIPELINES_RUN_LOG n WHERE n.PIPELINE_ID = r.PIPELINE_ID AND n.PIPELINE_RUN_ID > r.PIPELINE_RUN_ID "
    f"AND n.BACKFILL = 'N' AND n.STATUS IN {ENDED_RUN_SQL})) "
    "OR EXISTS (SELECT 1 FROM AUD_DEPENDENCY_CONSUMPTION c WHERE (c.CONSUMED_PIPELINE_RUN_ID = r.PIPELINE_RUN_ID "
    "OR c.PIPELINE_RUN_ID = r.PIPELINE_RUN_ID) AND NOT EXISTS (SELECT 1 FROM AUD_DEPENDENCY_CONSUMPTION n "
    "WHERE n.CONSUMPTION_ID > c.CONSUMPTION_ID AND (n.PIPELINE_DEPENDENCY_ID = c.PIPELINE_DEPENDENCY_ID "
    "OR n.TASK_DEPENDENCY_ID = c.TASK_DEPENDENCY_ID))))"
)
#: (referring run, referred run) pairs across runs: a gate decision's selection, a consumption's consumed run.
_REFERENCES = (
    "SELECT g.PIPELINE_RUN_ID, g.SELECTED_PIPELINE_RUN_ID FROM AUD_GATE_DECISIONS g "
    "WHERE g.SELECTED_PIPELINE_RUN_ID <> g.PIPELINE_RUN_ID{g} "
    "UNION SELECT g.PIPELINE_RUN_ID, tr.PIPELINE_RUN_ID FROM AUD_GATE_DECISIONS g JOIN AUD_TASK_RUN_LOG tr "
    "ON tr.TASK_RUN_ID = g.SELECTED_TASK_RUN_ID WHERE tr.PIPELINE_RUN_ID <> g.PIPELINE_RUN_ID{tr} "
    "UNION SELECT g.PIPELINE_RUN_ID, tr.PIPELINE_RUN_ID FROM AUD_GATE_DECISIONS g JOIN AUD_TASK_ATTEMPTS a "
    "ON a.ATTEMPT_ID = g.ATTEMPT_ID JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "
    "WHERE tr.PIPELINE_RUN_ID <> g.PIPELINE_RUN_ID{tr} "
    "UNION SELECT c.PIPELINE_RUN_ID, c.CONSUMED_PIPELINE_RUN_ID FROM AUD_DEPENDENCY_CONSUMPTION c "
    "WHERE c.CONSUMED_PIPELINE_RUN_ID <> c.PIPELINE_RUN_ID{c} "
    "UNION SELECT c.PIPELINE_RUN_ID, tr.PIPELINE_RUN_ID FROM AUD_DEPENDENCY_CONSUMPTION c JOIN AUD_TASK_RUN_LOG tr "
    "ON tr.TASK_RUN_ID = c.CONSUMED_TASK_RUN_ID WHERE tr.PIPELINE_RUN_ID <> c.PIPELINE_RUN_ID{tr}"
)


def _in(ids: Sequence[int]) -> str:
    return "(" + ", ".join("?" * len(ids)) + ")"


def _rows_of_batch(table: str, ids: Sequence[int]) -> tuple[str, tuple[int, ...]]:
    """The WHERE clause (and its parameters) selecting every row of ``table`` that goes with runs ``ids``."""
    runs = _in(ids)
    # Only placeholders are put into these texts (``_in``), never a value.
    task_runs = f"(SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID IN {runs})"  # noqa: S608
    attempts = (
        "(SELECT a.ATTEMPT_ID FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "  # noqa: S608
        f"WHERE tr.PIPELINE_RUN_ID IN {runs})"
    )
    p = tuple(ids)
    if table == "AUD_DEPENDENCY_CONSUMPTION":
        return (
            f"PIPELINE_RUN_ID IN {runs} OR CONSUMED_PIPELINE_RUN_ID IN {runs} OR CONSUMED_TASK_RUN_ID IN {task_runs}",
            p * 3,
        )
    if table == "AUD_GATE_DECISIONS":
        return (
            f"PIPELINE_RUN_ID IN {runs} OR SELECTED_PIPELINE_RUN_ID IN {runs} OR SELECTED_TASK_RUN_ID IN "
            f"{task_runs} OR ATTEMPT_ID IN {attempts}",
            p * 4,
        )
    if table == "AUD_TASK_ATTEMPTS":
        return f"TASK_RUN_ID IN {task_runs}", p
    return f"PIPELINE_RUN_ID IN {runs}", p  # task runs, interventions, runs


@dataclass
class PurgeResult:
    """What a purge did (or, dry, would do)."""

    purge_id: int | None
    cutoff: datetime
    pipeline: str | None
    dry_run: bool
    batch_size: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_COLUMNS.values(), 0))
    batches: int = 0
    kept: int = 0
    interrupted: list[int] = field(default_factory=list)
    archive: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "purge_id": self.purge_id,
            "status": PurgeStatus.DRY_RUN if self.dry_run else PurgeStatus.DONE,
            "cutoff": self.cutoff.isoformat(),
            "pipeline_code": self.pipeline,
            "dry_run": self.dry_run,
            "batch_size": self.batch_size,
            "batches": self.batches,
            "counts": dict(self.counts),
            "runs_kept": self.kept,
            "interrupted_purges": list(self.interrupted),
            "archive": self.archive,
        }


class _Replan(Exception):  # noqa: N818 - control flow inside this module
    """The batch changed under the purge (a run reopened, a new reference): roll back and plan again."""


@dataclass
class _Plan:
    candidates: set[int]
    kept: int


class Purge:
    """One purge on one connection (``conn`` in autocommit; each batch is its own transaction)."""

    def __init__(
        self,
        engine: EngineDialect,
        conn: Connection,
        cutoff: datetime,
        *,
        pipeline: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        archive_dir: Path | None = None,
        dry_run: bool = False,
        by: str | None = None,
        kind: str = actor.ActorKind.SYSTEM,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ConfigurationError(
                f"the purge batch size must be from 1 to {MAX_BATCH_SIZE} runs, got {batch_size}; a batch is one "
                "transaction, so keep it small enough that claims never wait long on it"
            )
        self.engine, self.conn, self.cutoff = engine, conn, cutoff
        self.pipeline, self.batch_size, self.dry_run = pipeline, batch_size, dry_run
        self.archive_dir = archive_dir
        self.by, self.kind = by or actor.current().name, kind
        self.on_batch = on_batch
        self.result = PurgeResult(
            purge_id=None, cutoff=cutoff, pipeline=pipeline, dry_run=dry_run, batch_size=batch_size
        )
        self._pipeline_id: int | None = None
        self._shared = False

    # -- reading -------------------------------------------------------------------------------------------

    def _query(
        self, sql: str, params: Sequence[Any] = (), cur: Cursor | None = None
    ) -> list[tuple[Any, ...]]:
        if cur is not None:
            return [tuple(r) for r in self.engine.rows(cur, sql, params)]
        return [tuple(r) for r in self.engine.query(self.conn, sql, params)]

    def plan(self, cur: Cursor | None = None) -> _Plan:
        """The runs that may go: finished before the cutoff, not protected, not referred to by a kept run."""
        cut = self.engine.to_db_time(self.cutoff)
        where, params = "", [cut]
        if self._pipeline_id is not None:
            where, params = " AND r.PIPELINE_ID = ?", [cut, self._pipeline_id]
        old = self._query(
            f"SELECT r.PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG r WHERE r.STATUS IN {ENDED_RUN_SQL} "  # noqa: S608
            "AND r.REPAIR_PENDING = 'N' "
            f"AND COALESCE(r.END_DATE, r.START_DATE) < ?{where}",
            params,
            cur,
        )
        candidates = {int(r[0]) for r in old} - {int(r[0]) for r in self._query(_PROTECTED, (), cur) if r[0]}
        found = len(old)
        refs: dict[int, set[int]] = {}
        for referrer, referred in self._query(_REFERENCES.format(g="", tr="", c=""), (), cur):
            if referrer is not None and referred is not None:
                refs.setdefault(int(referrer), set()).add(int(referred))
        # Everything a kept run refers to is kept, transitively.
        stack = [r for r in refs if r not in candidates]
        while stack:
            for referred in refs.get(stack.pop(), ()):
                if referred in candidates:
                    candidates.discard(referred)
                    stack.append(referred)
        return _Plan(candidates, found - len(candidates))

    def _check_batch(self, cur: Cursor, batch: list[int], candidates: set[int]) -> None:
        """Inside the batch's transaction: every run of the batch may still go, and so may every other run whose
        rows the batch deletes (rows that point at the batch). :raises _Replan: one may not."""
        runs = _in(batch)
        task_runs = f"(SELECT TASK_RUN_ID FROM AUD_TASK_RUN_LOG WHERE PIPELINE_RUN_ID IN {runs})"  # noqa: S608
        attempts = (
            "(SELECT a.ATTEMPT_ID FROM AUD_TASK_ATTEMPTS a JOIN AUD_TASK_RUN_LOG tr ON tr.TASK_RUN_ID = a.TASK_RUN_ID "  # noqa: S608
            f"WHERE tr.PIPELINE_RUN_ID IN {runs})"
        )
        refs = self._query(
            f"SELECT PIPELINE_RUN_ID FROM AUD_GATE_DECISIONS WHERE SELECTED_PIPELINE_RUN_ID IN {runs} "  # noqa: S608
            f"OR SELECTED_TASK_RUN_ID IN {task_runs} OR ATTEMPT_ID IN {attempts} "
            f"UNION SELECT PIPELINE_RUN_ID FROM AUD_DEPENDENCY_CONSUMPTION "
            f"WHERE CONSUMED_PIPELINE_RUN_ID IN {runs} OR CONSUMED_TASK_RUN_ID IN {task_runs}",
            tuple(batch) * 5,
            cur,
        )
        referring = {int(r[0]) for r in refs}
        outside = sorted(referring - candidates)
        if outside:
            raise _Replan(f"kept run(s) {outside} refer to the batch")
        touched = sorted(referring | set(batch))
        changed = self._query(
            f"SELECT PIPELINE_RUN_ID FROM AUD_PIPELINES_RUN_LOG WHERE PIPELINE_RUN_ID IN {_in(touched)} AND "  # noqa: S608
            f"(STATUS NOT IN {ENDED_RUN_SQL} OR REPAIR_PENDING <> 'N') "
            "UNION " + _PROTECTED_AMONG.format(ids=_in(touched)),
            (*touched, *touched),
            cur,
        )
        if changed:
            raise _Replan(f"run(s) {sorted(int(r[0]) for r in changed)} became protected")

    # -- writing -------------------------------------------------------------------------------------------

    @contextmanager
    def _batch_transaction(self) -> Iterator[Cursor]:
        """A transaction in which the append-only guards let this purge delete (ENGINE 0005)."""
        assert self.result.purge_id is not None
        with (
            actor.acting_as(self.by, self.kind, purpose="retention"),
            self.engine.transaction(self.conn) as cur,
        ):
            if self.engine.name == "postgresql":
                cur.execute(
                    "SELECT set_config('etl_craft_airflow.purge', %s, true), "
                    "set_config('etl_craft.purpose', 'retention', true)",
                    (str(self.result.purge_id),),
                )
            elif not self._shared:
                cur.execute(
                    self.engine.sql("UPDATE AUD_ENGINE_PURGES SET BATCH_OPEN = 'Y' WHERE PURGE_ID = ?"),
                    (self.result.purge_id,),
                )
            yield cur
            if self.engine.name != "postgresql" and not self._shared:
                cur.execute(
                    self.engine.sql("UPDATE AUD_ENGINE_PURGES SET BATCH_OPEN = 'N' WHERE PURGE_ID = ?"),
                    (self.result.purge_id,),
                )

    def _select(self, cur: Cursor, table: str, where: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cur.execute(self.engine.sql(f"SELECT * FROM {table} WHERE {where}"), tuple(params))  # noqa: S608
        names = [d[0].upper() for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def _delete_rows(
        self, cur: Cursor, parts: Iterable[tuple[str, str, Sequence[Any]]], batch_no: int
    ) -> dict[str, int]:
        """Archive (when asked) then delete each ``(table, where, params)``, in order; the count per table."""
        selected = [(t, w, p, self._select(cur, t, w, p)) for t, w, p in parts]
        if self.archive_dir is not None:
            self._archive(batch_no, [(t, rows) for t, _, _, rows in selected])
        counts: dict[str, int] = {}
        for table, where, params, rows in selected:
            if not rows:
                continue
            cur.execute(self.engine.sql(f"DELETE FROM {table} WHERE {where}"), tuple(params))  # noqa: S608
            if cur.rowcount != len(rows):  # a row appeared or went between the archive and the delete
                raise _Replan(f"{table}: archived {len(rows)} row(s) but {cur.rowcount} matched the delete")
            counts[table] = counts.get(table, 0) + len(rows)
        return counts

    def _record(self, cur: Cursor, counts: dict[str, int]) -> None:
        sets = ", ".join(f"{COUNT_COLUMNS[t]} = {COUNT_COLUMNS[t]} + ?" for t in counts)
        cur.execute(
            self.engine.sql(
                f"UPDATE AUD_ENGINE_PURGES SET BATCHES = BATCHES + 1, HEARTBEAT_AT = ?{', ' if sets else ''}{sets} "  # noqa: S608
                "WHERE PURGE_ID = ?"
            ),
            (self.engine.to_db_time(self.engine.now()), *counts.values(), self.result.purge_id),
        )
        for table, n in counts.items():
            self.result.counts[COUNT_COLUMNS[table]] += n
        self.result.batches += 1

    def _archive(self, batch_no: int, tables: list[tuple[str, list[dict[str, Any]]]]) -> None:
        """One JSON Lines file per table of the batch, fsynced, then their sha256 lines in the manifest."""
        assert self.archive_dir is not None and self.result.purge_id is not None
        folder = self.archive_dir / f"purge-{self.result.purge_id:06d}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lines = []
            for table, rows in tables:
                if not rows:
                    continue
                name = f"batch-{batch_no:06d}-{table}.jsonl"
                data = "".join(
                    json.dumps(row, default=_json_value, sort_keys=True) + "\n" for row in rows
                ).encode()
                _write_synced(folder / name, data, "wb")
                lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
            if lines:
                _write_synced(folder / MANIFEST, "".join(lines).encode(), "ab")
        except OSError as exc:
            raise ConfigurationError(
                f"purge {self.result.purge_id} cannot write its archive in {folder} ({exc.strerror or exc}); "
                f"batch {batch_no} was not deleted (nothing is deleted before it is archived): give --archive a "
                "writable folder with free space and run the purge again"
            ) from None

    # -- the purge -----------------------------------------------------------------------------------------

    def run(self) -> PurgeResult:
        require_current(self.engine, self.conn)
        self._shared = "ETL_CRAFT_AIRFLOW_MIGRATIONS" in self.engine.table_names(self.conn)
        if self.pipeline is not None:
            found = self._query(
                "SELECT PIPELINE_ID FROM CFG_PIPELINES WHERE PIPELINE_CODE = ? ORDER BY ACTIVE_FLAG DESC, PIPELINE_ID",
                (self.pipeline,),
            )
            if not found:
                raise MetadataError(
                    f"no pipeline has PIPELINE_CODE {self.pipeline} in CFG_PIPELINES of the Engine DB "
                    f"{self.engine.describe()}; fix --pipeline (`etl-craft-airflow pipelines` lists them)"
                )
            self._pipeline_id = int(found[0][0])
        if self.dry_run:
            return self._dry_run()
        self._start()
        try:
            self._purge_runs()
            self._purge_loose_rows()
        except BaseException as exc:
            self._end(PurgeStatus.FAILED, f"{type(exc).__name__}: {exc}"[:2000])
            raise
        self._end(PurgeStatus.DONE, None)
        return self.result

    def _dry_run(self) -> PurgeResult:
        plan = self.plan()
        ids = sorted(plan.candidates)
        self.result.kept = plan.kept
        keys = dict(TABLES)
        seen: dict[str, set[int]] = {table: set() for table, _ in TABLES}
        for start in range(0, len(ids), self.batch_size):
            batch = ids[start : start + self.batch_size]
            for table, key in TABLES[:-1]:
                where, params = _rows_of_batch(table, batch)
                found = self._query(f"SELECT {key} FROM {table} WHERE {where}", params)  # noqa: S608
                seen[table].update(int(r[0]) for r in found)  # a row two batches reach is counted once
            self.result.batches += 1
        for table, loose, values in self._loose_parts():
            found = self._query(f"SELECT {keys[table]} FROM {table} WHERE {loose}", values)  # noqa: S608
            seen[table].update(int(r[0]) for r in found)
        for table, rows in seen.items():
            self.result.counts[COUNT_COLUMNS[table]] = len(rows)
        return self.result

    def _start(self) -> None:
        """Mark dead purges INTERRUPTED and insert this purge's RUNNING row, in one transaction."""
        now = self.engine.now()
        host, pid = socket.gethostname(), os.getpid()
        with actor.acting_as(self.by, self.kind), self.engine.transaction(self.conn) as cur:
            running = self.engine.rows(
                cur,
                "SELECT PURGE_ID, HOST, PID, HEARTBEAT_AT, STARTED_AT FROM AUD_ENGINE_PURGES WHERE STATUS = 'RUNNING'",
            )
            dead: list[int] = []
            alive: list[int] = []
            for purge_id, their_host, their_pid, beat, started in running:
                last = self.engine.from_db_time(beat or started)
                gone = their_host == host and their_pid is not None and not _pid_alive(int(their_pid))
                (dead if gone or last is None or now - last > STALE_AFTER else alive).append(int(purge_id))
            if alive:
                raise RunStateError(
                    f"purge {alive[0]} is still running on the Engine DB {self.engine.describe()} (its heartbeat is "
                    f"newer than {int(STALE_AFTER.total_seconds() // 60)} minutes); wait for it to end, or, if its "
                    "process is gone, run the purge again after that time"
                )
            cur.execute(
                self.engine.sql(
                    "INSERT INTO AUD_ENGINE_PURGES (STATUS, REQUESTED_BY, REQUESTED_BY_KIND, HOST, PID, STARTED_AT, "
                    "HEARTBEAT_AT, CUTOFF, PIPELINE_CODE, BATCH_SIZE, ARCHIVE_DIR) "
                    "VALUES ('RUNNING', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING PURGE_ID"
                ),
                (
                    self.by, self.kind, host, pid, self.engine.to_db_time(now), self.engine.to_db_time(now),
                    self.engine.to_db_time(self.cutoff), self.pipeline, self.batch_size,
                    None if self.archive_dir is None else str(self.archive_dir),
                ),
            )  # fmt: skip
            row = cur.fetchone()
            assert row is not None
            self.result.purge_id = int(row[0])
            for purge_id in dead:
                cur.execute(
                    self.engine.sql(
                        "UPDATE AUD_ENGINE_PURGES SET STATUS = 'INTERRUPTED', RESUMED_BY_PURGE_ID = ?, MESSAGE = "
                        "'its process ended before the purge did; the purge that resumed it continued its work' "
                        "WHERE PURGE_ID = ? AND STATUS = 'RUNNING'"
                    ),
                    (self.result.purge_id, purge_id),
                )
            self.result.interrupted = dead
        if self.archive_dir is not None:
            self.result.archive = str(self.archive_dir / f"purge-{self.result.purge_id:06d}")

    def _end(self, status: PurgeStatus, message: str | None) -> None:
        if self.result.purge_id is None:
            return
        try:
            with actor.acting_as(self.by, self.kind), self.engine.transaction(self.conn) as cur:
                cur.execute(
                    self.engine.sql(
                        "UPDATE AUD_ENGINE_PURGES SET STATUS = ?, ENDED_AT = ?, MESSAGE = ? WHERE PURGE_ID = ?"
                    ),
                    (status, self.engine.to_db_time(self.engine.now()), message, self.result.purge_id),
                )
        except Exception:
            if status == PurgeStatus.DONE:
                raise
            # FAILED is best effort: a row left RUNNING is recognised as interrupted by the next purge.

    def _purge_runs(self) -> None:
        replans = 0
        plan = self.plan()
        self.result.kept = plan.kept
        size = min(self.batch_size, FIRST_BATCH)
        while plan.candidates:
            started = time.monotonic()
            batch = sorted(plan.candidates)[:size]
            try:
                with self._batch_transaction() as cur:
                    self._check_batch(cur, batch, plan.candidates)
                    parts = [(t, *_rows_of_batch(t, batch)) for t, _ in TABLES[:-1]]
                    counts = self._delete_rows(cur, parts, self.result.batches + 1)
                    self._record(cur, counts)
            except (_Replan, self.engine.integrity_error()) as exc:  # history changed under the batch
                replans += 1
                if replans > REPLANS:
                    raise LockTimeoutError(
                        f"purge {self.result.purge_id} gave up after {REPLANS} batches in a row that concurrent "
                        f"writers changed under it on the Engine DB {self.engine.describe()} ({exc}); the batches "
                        "before it stay deleted: run the purge again, at a quieter time or with a smaller --batch-size"
                    ) from exc
                plan = self.plan()
                self.result.kept = plan.kept
                continue
            plan.candidates.difference_update(batch)
            size = _next_size(size, self.batch_size, time.monotonic() - started)
            self._pause(started)
            if self.on_batch is not None:
                self.on_batch(self.result.batches)

    def _pause(self, started: float) -> None:
        """SQLite: leave the write lock free for :data:`SQLITE_PAUSE`, or as long as the batch took, if longer."""
        if self.engine.name == "sqlite":
            time.sleep(max(SQLITE_PAUSE, time.monotonic() - started))

    def _loose_parts(self) -> list[tuple[str, str, list[Any]]]:
        """Rows of no run that ended before the cutoff: resumed pauses, and interventions without a run."""
        cut = self.engine.to_db_time(self.cutoff)
        only = "" if self._pipeline_id is None else " AND PIPELINE_ID = ?"
        extra = [] if self._pipeline_id is None else [self._pipeline_id]
        return [
            ("AUD_RUN_INTERVENTIONS", f"PIPELINE_RUN_ID IS NULL AND REQUESTED_AT < ?{only}", [cut, *extra]),
            ("AUD_PIPELINE_PAUSES", f"RESUMED_AT IS NOT NULL AND RESUMED_AT < ?{only}", [cut, *extra]),
        ]

    def _purge_loose_rows(self) -> None:
        """Pauses and run-less interventions, ``batch_size`` rows of each per transaction."""
        keys = dict(TABLES)
        for table, where, params in self._loose_parts():
            key = keys[table]
            while True:
                started = time.monotonic()
                with self._batch_transaction() as cur:
                    ids = [
                        int(r[0])
                        for r in self._query(
                            f"SELECT {key} FROM {table} WHERE {where} ORDER BY {key} LIMIT ?",  # noqa: S608
                            (*params, self.batch_size),
                            cur,
                        )
                    ]
                    if not ids:
                        break
                    counts = self._delete_rows(
                        cur, [(table, f"{key} IN {_in(ids)}", ids)], self.result.batches + 1
                    )
                    self._record(cur, counts)
                self._pause(started)


def _json_value(value: Any) -> Any:
    """JSON for what the drivers return besides str/int/float/None: times ISO-8601, decimals as text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def _write_synced(path: Path, data: bytes, mode: str) -> None:
    with open(path, mode) as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_age(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s`` or ``2w``: how old a run must be to go.

    :raises ValueError: anything else (the CLI shows it as a usage error).
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = text.strip().lower()
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"must be a whole number with a unit s, m, h, d or w (e.g. 90d), got {text!r}")
    return timedelta(seconds=int(text[:-1]) * units[text[-1]])


def _next_size(size: int, largest: int, took: float) -> int:
    """The next batch's run count, from how long a batch of ``size`` runs took (see :data:`BATCH_BUDGET`)."""
    if took > BATCH_BUDGET:
        return max(1, min(size - 1, int(size * BATCH_BUDGET / took)))
    if took < BATCH_BUDGET / 4:
        return min(largest, size * 2)
    return size
