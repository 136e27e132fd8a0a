"""Prompt and guideline versions (immutable), their labels, the audit of every label move, and the
running experiment of each prompt.

Queries read the ``production`` label (or an experiment's variant) on every answer, so the reads
are cached. A label move or an experiment starting or stopping sends a NOTIFY on
``ragsvc_prompts`` in the same transaction; every process LISTENs on its own connection and drops
its cached entries for that prompt when the notification arrives, so a move made by any process
(``ragsvc prompts label`` while servers run) is seen at once. The cache also expires after
``ttl_s``, which bounds staleness if the listening connection is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from rag_service.db.engine import Database, libpq_conninfo
from rag_service.domain.prompts import Experiment, LabelMove, PromptKind, PromptSummary, PromptVersion
from rag_service.errors import ConflictError, NotFoundError

log = logging.getLogger(__name__)

CHANNEL = "ragsvc_prompts"
T = TypeVar("T")
_VERSION = ("v.kind, v.name, v.version, v.body, v.parameters, v.author, v.source, v.note, v.parent_version, "
            "v.review_ids, v.created_at, ARRAY(SELECT l.label FROM prompt_labels l WHERE l.kind = v.kind "
            "AND l.name = v.name AND l.version = v.version ORDER BY l.label) AS labels")
_EXPERIMENT = ("id, name, control_label, candidate_label, control_version, candidate_version, share, alpha, tau, "
               "status, stop_reason, started_by, note, created_at, ended_at")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def rollback_target(moves: list[tuple[int | None, bool]]) -> int | None:
    """Where a rollback points a label, from its moves oldest first as (from_version, is_rollback):
    every ordinary move stacks the version it left, every rollback took the top one back, so the
    next rollback takes the one below (two rollbacks undo two moves, not each other). None: nothing
    left to go back to."""
    stack: list[int | None] = []
    for from_version, is_rollback in moves:
        if is_rollback:
            if stack:
                stack.pop()
        else:
            stack.append(from_version)
    return stack[-1] if stack else None


def _version(row: Any) -> PromptVersion:
    return PromptVersion.model_validate(dict(row._mapping))


async def notify(conn: AsyncConnection, kind: str, name: str) -> None:
    """Tell every process to forget what it cached of this prompt (delivered on commit)."""
    await conn.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": f"{kind}:{name}"})


class PromptRepository:
    def __init__(self, db: Database, ttl_s: float = 30.0) -> None:
        self._db = db
        self._ttl_s = ttl_s
        # (kind, name, label) -> (expires, version); ("experiment", name, "") -> (expires, Experiment | None)
        self._cache: dict[tuple[str, str, str], tuple[float, Any]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._versions: dict[tuple[str, str, int], PromptVersion] = {}  # immutable: kept (bounded)
        self.invalidations = 0  # notifications received (tests and logs read it)
        # Bumped by every forget: a read that started before a notification must not store what it
        # read after it (it may be the old version).
        self._generation = 0

    @property
    def db(self) -> Database:
        return self._db

    # --- cached reads on the query path ----------------------------------------------------------

    async def by_label(self, kind: PromptKind, name: str, label: str) -> PromptVersion:
        """The version ``label`` points at (cached; see the module docstring)."""

        async def load(conn: AsyncConnection) -> PromptVersion:
            row = (await conn.execute(text(
                f"SELECT {_VERSION} FROM prompt_versions v JOIN prompt_labels l ON l.kind = v.kind AND "
                "l.name = v.name AND l.version = v.version WHERE l.kind = :kind AND l.name = :name "
                "AND l.label = :label"), {"kind": kind, "name": name, "label": label})).first()
            if row is None:
                raise NotFoundError(f"{kind} {name!r} has no label {label!r}")
            return _version(row)

        return await self._cached((kind, name, label), load)

    async def running_experiment(self, name: str) -> Experiment | None:
        """The running experiment on prompt ``name`` (cached like the labels)."""

        async def load(conn: AsyncConnection) -> Experiment | None:
            row = (await conn.execute(text(
                f"SELECT {_EXPERIMENT} FROM experiments WHERE name = :name AND status = 'running'"),
                {"name": name})).first()
            return None if row is None else Experiment.model_validate(dict(row._mapping))

        return await self._cached(("experiment", name, ""), load)

    async def _cached(self, key: tuple[str, str, str], load: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        self._listen()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        generation = self._generation
        async with self._db.connect() as conn:
            found = await load(conn)
        # A notification that arrived while we read may concern what we read: then do not keep it.
        if generation == self._generation:
            self._cache[key] = (time.monotonic() + self._ttl_s, found)
        return found

    def forget(self, kind: str, name: str) -> None:
        self._generation += 1
        for key in [k for k in self._cache if k[1] == name and k[0] in (kind, "experiment")]:
            del self._cache[key]

    def _listen(self) -> None:
        stale = self._listener is not None and self._listener.get_loop() is not _running_loop()
        if self._listener is None or self._listener.done() or stale:
            with contextlib.suppress(RuntimeError):  # no running loop: reads still work, cached for ttl_s
                self._listener = asyncio.get_running_loop().create_task(self._listen_forever())

    async def _listen_forever(self) -> None:
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(libpq_conninfo(self._db.url),
                                                                 autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    # Whatever changed while we were not listening is unknown: start afresh.
                    self._generation += 1
                    self._cache.clear()
                    delay = 0.5
                    async for note in conn.notifies():
                        kind, _, name = note.payload.partition(":")
                        self.forget(kind, name)
                        self.invalidations += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cache's TTL covers the gap; keep trying
                log.warning("prompt label listener disconnected (%s); retrying in %.1f s", exc, delay)
                self._generation += 1
                self._cache.clear()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None

    # --- reads for the API and CLI -----------------------------------------------------------------

    async def summaries(self, kind: PromptKind | None = None) -> list[PromptSummary]:
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT v.kind, v.name, max(v.version) AS latest_version, count(*) AS versions, "
                "COALESCE((SELECT jsonb_object_agg(l.label, l.version) FROM prompt_labels l WHERE l.kind = v.kind "
                "AND l.name = v.name), '{}'::jsonb) AS labels FROM prompt_versions v "
                "WHERE (CAST(:kind AS text) IS NULL OR v.kind = :kind) GROUP BY v.kind, v.name "
                "ORDER BY v.kind, v.name"),
                {"kind": kind})).all()
        return [PromptSummary.model_validate(dict(r._mapping)) for r in rows]

    async def versions(self, kind: PromptKind, name: str, *, limit: int = 50, offset: int = 0
                       ) -> tuple[list[PromptVersion], int]:
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {_VERSION} FROM prompt_versions v WHERE v.kind = :kind AND v.name = :name "
                "ORDER BY v.version DESC LIMIT :limit OFFSET :offset"),
                {"kind": kind, "name": name, "limit": limit, "offset": offset})).all()
            total = (await conn.execute(text(
                "SELECT count(*) FROM prompt_versions WHERE kind = :kind AND name = :name"),
                {"kind": kind, "name": name})).scalar_one()
        if total == 0:
            raise NotFoundError(await self._unknown(kind, name))
        return [_version(r) for r in rows], total

    async def pinned(self, kind: PromptKind, name: str, version: int) -> PromptVersion:
        """A version for the query path, remembered: bodies and parameters never change (its
        ``labels`` are as they were when first read)."""
        key = (kind, name, version)
        if key not in self._versions:
            found = await self.version(kind, name, version)
            if len(self._versions) < 1_000:
                self._versions[key] = found
            return found
        return self._versions[key]

    async def version(self, kind: PromptKind, name: str, version: int) -> PromptVersion:
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                f"SELECT {_VERSION} FROM prompt_versions v WHERE v.kind = :kind AND v.name = :name "
                "AND v.version = :version"), {"kind": kind, "name": name, "version": version})).first()
        if row is None:
            raise NotFoundError(f"{kind} {name!r} has no version {version}")
        return _version(row)

    async def labels(self, kind: PromptKind, name: str) -> dict[str, int]:
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT label, version FROM prompt_labels WHERE kind = :kind AND name = :name ORDER BY label"),
                {"kind": kind, "name": name})).all()
        return {r.label: r.version for r in rows}

    async def moves(self, kind: PromptKind, name: str, label: str | None = None, *, limit: int = 50
                    ) -> list[LabelMove]:
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT id, kind, name, label, from_version, to_version, actor, reason, forced, rollback, "
                "experiment_id, created_at FROM prompt_label_moves WHERE kind = :kind AND name = :name "
                "AND (CAST(:label AS text) IS NULL OR label = :label) ORDER BY id DESC LIMIT :limit"),
                {"kind": kind, "name": name, "label": label, "limit": limit})).all()
        return [LabelMove.model_validate(dict(r._mapping)) for r in rows]

    async def _unknown(self, kind: str, name: str) -> str:
        known = [s.name for s in await self.summaries(kind)]  # type: ignore[arg-type]
        return f"no {kind} named {name!r}; known: {known}"

    # --- writes (one transaction each, with the NOTIFY) ----------------------------------------------

    async def create(self, kind: PromptKind, name: str, *, body: str, parameters: dict[str, Any],
                     author: str | None, source: str, note: str | None, parent_version: int | None,
                     review_ids: list[uuid.UUID] | None = None, label: str | None = None) -> PromptVersion:
        """A new version (the next number), and ``label`` moved to it when given."""
        async with self._db.begin() as conn:
            # Serialise version numbering per prompt; the unique constraint would catch a race anyway.
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"prompt:{kind}:{name}"})
            version = (await conn.execute(text(
                "SELECT COALESCE(max(version), 0) + 1 FROM prompt_versions WHERE kind = :kind AND name = :name"),
                {"kind": kind, "name": name})).scalar_one()
            await conn.execute(text(
                "INSERT INTO prompt_versions (kind, name, version, body, parameters, author, source, note, "
                "parent_version, review_ids) VALUES (:kind, :name, :version, :body, CAST(:parameters AS jsonb), "
                ":author, :source, :note, :parent, CAST(:review_ids AS uuid[]))"),
                {"kind": kind, "name": name, "version": version, "body": body, "parameters": json.dumps(parameters),
                 "author": author, "source": source, "note": note, "parent": parent_version,
                 "review_ids": [str(r) for r in review_ids or []]})
            if label is not None:
                await self._move(conn, kind, name, label, version, actor=author, reason=note or "new version")
        self.forget(kind, name)
        return await self.version(kind, name, version)

    async def move_label(self, kind: PromptKind, name: str, label: str, version: int, *, actor: str | None,
                         reason: str | None, forced: bool = False, experiment_id: uuid.UUID | None = None,
                         expected_from: int | None = None) -> LabelMove:
        """Point ``label`` at ``version`` and record the move. ``expected_from``: refuse (409) when
        the label has moved since the caller looked (a promotion decided on old evidence)."""
        async with self._db.begin() as conn:
            move = await self._move(conn, kind, name, label, version, actor=actor, reason=reason, forced=forced,
                                    experiment_id=experiment_id, expected_from=expected_from)
        self.forget(kind, name)
        return move

    async def _move(self, conn: AsyncConnection, kind: str, name: str, label: str, version: int, *,
                    actor: str | None, reason: str | None, forced: bool = False,
                    experiment_id: uuid.UUID | None = None, expected_from: int | None = None,
                    rollback: bool = False) -> LabelMove:
        exists = (await conn.execute(text(
            "SELECT 1 FROM prompt_versions WHERE kind = :kind AND name = :name AND version = :version"),
            {"kind": kind, "name": name, "version": version})).first()
        if exists is None:
            raise NotFoundError(f"{kind} {name!r} has no version {version}")
        current = (await conn.execute(text(
            "SELECT version FROM prompt_labels WHERE kind = :kind AND name = :name AND label = :label FOR UPDATE"),
            {"kind": kind, "name": name, "label": label})).scalar_one_or_none()
        if expected_from is not None and current != expected_from:
            raise ConflictError(f"label {label!r} of {name!r} points at version {current}, not {expected_from} as "
                                "expected: it moved since (an experiment compares against the version it started "
                                "with); look again before moving it",
                                fields={"label": label, "version": current})
        await conn.execute(text(
            "INSERT INTO prompt_labels (kind, name, label, version, moved_by) VALUES (:kind, :name, :label, "
            ":version, :actor) ON CONFLICT (kind, name, label) DO UPDATE SET version = EXCLUDED.version, "
            "moved_by = EXCLUDED.moved_by, moved_at = now()"),
            {"kind": kind, "name": name, "label": label, "version": version, "actor": actor})
        row = (await conn.execute(text(
            "INSERT INTO prompt_label_moves (kind, name, label, from_version, to_version, actor, reason, forced, "
            "experiment_id, rollback) VALUES (:kind, :name, :label, :from_version, :version, :actor, :reason, "
            ":forced, :experiment_id, :rollback) RETURNING id, kind, name, label, from_version, to_version, actor, "
            "reason, forced, rollback, experiment_id, created_at"),
            {"kind": kind, "name": name, "label": label, "from_version": current, "version": version, "actor": actor,
             "reason": reason, "forced": forced, "experiment_id": experiment_id, "rollback": rollback})).one()
        await notify(conn, kind, name)
        return LabelMove.model_validate(dict(row._mapping))

    async def rollback(self, kind: PromptKind, name: str, label: str, *, actor: str | None,
                       reason: str | None) -> LabelMove:
        """Point ``label`` back at the version it pointed at before its last move not yet rolled
        back (``rollback_target``)."""
        async with self._db.begin() as conn:
            current = (await conn.execute(text(
                "SELECT version FROM prompt_labels WHERE kind = :kind AND name = :name AND label = :label FOR UPDATE"),
                {"kind": kind, "name": name, "label": label})).scalar_one_or_none()
            if current is None:
                raise NotFoundError(f"{kind} {name!r} has no label {label!r}")
            moves = (await conn.execute(text(
                "SELECT from_version, rollback FROM prompt_label_moves WHERE kind = :kind AND name = :name "
                "AND label = :label ORDER BY id"), {"kind": kind, "name": name, "label": label})).all()
            target = rollback_target([(m.from_version, m.rollback) for m in moves])
            if target is None:
                raise ConflictError(f"label {label!r} of {name!r} has no earlier version to roll back to (it points "
                                    f"at version {current})")
            move = await self._move(conn, kind, name, label, target, actor=actor,
                                    reason=reason or f"rollback from version {current}", expected_from=current,
                                    rollback=True)
        self.forget(kind, name)
        return move
