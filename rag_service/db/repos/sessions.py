"""The reviewer console's sign-in sessions (table ``console_sessions``).

The cookie carries a random token; the table keeps its SHA-256, so a copy of the table opens no
session. A session is only as good as its key: reading one joins ``api_keys``, so revoking the
key (from any process) ends its sessions on their next request, with no cache in between.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.db.repos.keys import MAX_KEY_CHARS, _caller, hash_key
from rag_service.domain import Caller


@dataclass(frozen=True)
class ConsoleSession:
    caller: Caller
    csrf_token: str
    expires_at: datetime


class ConsoleSessionRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def open(self, key_id: uuid.UUID, role: str, hours: float) -> tuple[str, datetime]:
        """A new session for this key: (the cookie's token, shown this once; when it expires).
        Expired sessions are swept here, so the table holds live ones plus those not yet swept."""
        token = secrets.token_urlsafe(32)
        async with self._db.begin() as conn:
            await conn.execute(text("DELETE FROM console_sessions WHERE expires_at <= now()"))
            expires_at = (await conn.execute(text(
                "INSERT INTO console_sessions (token_hash, key_id, role, csrf_token, expires_at) "
                "VALUES (:hash, :key_id, :role, :csrf, now() + make_interval(secs => :seconds)) RETURNING expires_at"),
                {"hash": hash_key(token), "key_id": key_id, "role": role, "csrf": secrets.token_urlsafe(32),
                 "seconds": hours * 3600})).scalar_one()
        return token, expires_at

    async def get(self, token: str) -> ConsoleSession | None:
        """The live session of this token: not expired, its key not revoked and still of the role
        it signed in with. None otherwise."""
        if not token or len(token) > MAX_KEY_CHARS:
            return None
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT s.csrf_token, s.expires_at, k.id, k.name, k.role, k.tenant, k.principals, k.collections "
                "FROM console_sessions s JOIN api_keys k ON k.id = s.key_id WHERE s.token_hash = :hash "
                "AND s.expires_at > now() AND k.revoked_at IS NULL AND k.role = s.role"),
                {"hash": hash_key(token)})).first()
        if row is None:
            return None
        return ConsoleSession(caller=_caller(row), csrf_token=row.csrf_token, expires_at=row.expires_at)

    async def close(self, token: str) -> None:
        """End the session (signing out); unknown tokens are ignored."""
        if not token or len(token) > MAX_KEY_CHARS:
            return
        async with self._db.begin() as conn:
            await conn.execute(text("DELETE FROM console_sessions WHERE token_hash = :hash"),
                               {"hash": hash_key(token)})
