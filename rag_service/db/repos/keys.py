"""API keys: created, listed, revoked, and checked on every request.

Only the SHA-256 of a key is stored. Keys are 256-bit random strings, so a fast unsalted hash is
enough: nobody can guess a key from its hash, and a lookup is one indexed equality.

Requests must not cost a round trip each, so ``authenticate`` and ``any_active`` remember their
answers for ``ttl_s`` (5 s). A key revoked through this process stops working at once; revoked
through another process (``ragsvc keys revoke`` while the server runs), within ``ttl_s``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.domain import DEFAULT_TENANT, ROLES, TENANT_PATTERN, ApiKeyView, Caller, Role
from rag_service.errors import InvalidInputError, NotFoundError

KEY_PREFIX = "rsk_"
# What listings show of a key: "rsk_" and 8 random characters (48 bits), enough to tell keys apart.
SHOWN_CHARS = 12
# A key is "rsk_" + 43 url-safe characters; anything much longer is not worth hashing.
MAX_KEY_CHARS = 200
# last_used_at is written at most this often per key: a timestamp per request would be a write per request.
TOUCH_EVERY_S = 60
# How long a process remembers what a key stands for (the default ``ttl_s``).
KEY_CACHE_S = 5.0
# Answers remembered at most this many keys at once (unknown keys are remembered too, so a client
# retrying a bad key does not reach the database every time; the bound keeps a flood of them small).
MAX_CACHED_KEYS = 10_000

_COLUMNS = "id, name, prefix, role, tenant, principals, collections, created_at, last_used_at, revoked_at"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """``rsk_`` and 256 random bits, url-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _view(row: Any) -> ApiKeyView:
    return ApiKeyView.model_validate(dict(row._mapping))


def _caller(row: Any) -> Caller:
    return Caller(
        key_id=row.id, name=row.name, role=row.role, tenant=row.tenant, principals=tuple(row.principals),
        # An empty list in the table means every collection; no principals means public documents only.
        collections=tuple(row.collections) or None,
    )


class ApiKeyRepository:
    def __init__(self, db: Database, ttl_s: float = KEY_CACHE_S) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._callers: dict[str, tuple[float, Caller | None]] = {}  # key hash -> (expires, caller)
        self._any_active: tuple[float, bool] | None = None

    async def create(self, role: Role, principals: Sequence[str] = (), collections: Sequence[str] = (),
                     name: str | None = None, tenant: str = DEFAULT_TENANT) -> tuple[ApiKeyView, str]:
        """A new key: its listing entry and the key itself, which is shown this once and never stored."""
        if role not in ROLES:
            raise InvalidInputError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        if not re.fullmatch(TENANT_PATTERN, tenant):
            raise InvalidInputError(f"tenant {tenant!r} must be 1-63 lowercase letters, digits, '_' or '-', "
                                    "starting with a letter or digit")
        principals = list(dict.fromkeys(p.strip() for p in principals))
        if any(not p or p == "*" for p in principals):
            raise InvalidInputError("principals must be non-empty names other than '*'")
        collections = list(dict.fromkeys(c.strip() for c in collections))
        if any(not c for c in collections):
            raise InvalidInputError("collection names must not be empty")
        key = new_key()
        async with self._db.begin() as conn:
            row = (await conn.execute(text(
                "INSERT INTO api_keys (id, name, prefix, key_hash, role, tenant, principals, collections) "
                "VALUES (:id, :name, :prefix, :hash, :role, :tenant, CAST(:principals AS text[]), "
                f"CAST(:collections AS text[])) RETURNING {_COLUMNS}"),
                {"id": uuid.uuid4(), "name": name or None, "prefix": key[:SHOWN_CHARS], "hash": hash_key(key),
                 "role": role, "tenant": tenant, "principals": principals, "collections": collections})).one()
        self._callers.pop(hash_key(key), None)
        self._any_active = (time.monotonic() + self._ttl_s, True)
        return _view(row), key

    async def list(self, *, include_revoked: bool = True) -> list[ApiKeyView]:
        where = "" if include_revoked else " WHERE revoked_at IS NULL"
        async with self._db.connect() as conn:
            rows = await conn.execute(text(f"SELECT {_COLUMNS} FROM api_keys{where} ORDER BY created_at, id"))
            return [_view(r) for r in rows]

    async def revoke(self, id_or_prefix: str) -> ApiKeyView:
        """Revoke the key with this id, listed prefix (or the whole key). Revoking twice is harmless."""
        ident = id_or_prefix.strip()
        try:
            key_id: uuid.UUID | None = uuid.UUID(ident)
        except ValueError:
            key_id = None
        async with self._db.begin() as conn:
            if key_id is not None:
                rows = (await conn.execute(text(f"SELECT {_COLUMNS} FROM api_keys WHERE id = :id FOR UPDATE"),
                                           {"id": key_id})).all()
            else:
                rows = (await conn.execute(text(
                    f"SELECT {_COLUMNS} FROM api_keys WHERE prefix = :p OR key_hash = :hash FOR UPDATE"),
                    {"p": ident, "hash": hash_key(ident)})).all()
            if not rows:
                raise NotFoundError(f"no API key with id or prefix {ident!r}; `ragsvc keys list` shows them")
            if len(rows) > 1:
                raise InvalidInputError(f"{len(rows)} keys share the prefix {ident!r}; revoke by id instead "
                                        f"({', '.join(str(r.id) for r in rows)})")
            row = (await conn.execute(text(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = :id "
                f"RETURNING {_COLUMNS}"), {"id": rows[0].id})).one()
        # This process stops accepting it now; others within their cache's TTL.
        self._callers.clear()
        self._any_active = None
        return _view(row)

    async def authenticate(self, key: str) -> Caller | None:
        """The caller a key stands for, or None when it is unknown or revoked."""
        if not key.startswith(KEY_PREFIX) or len(key) > MAX_KEY_CHARS:
            return None
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._callers.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT id, name, role, tenant, principals, collections, "
                "last_used_at IS NULL OR last_used_at < now() - make_interval(secs => :every) AS stale "
                "FROM api_keys WHERE key_hash = :hash AND revoked_at IS NULL"),
                {"hash": digest, "every": TOUCH_EVERY_S})).first()
            if row is not None and row.stale:
                # Checked again in the UPDATE so that many processes seeing the same stale time
                # write once between them.
                await conn.execute(text(
                    "UPDATE api_keys SET last_used_at = now() WHERE id = :id "
                    "AND (last_used_at IS NULL OR last_used_at < now() - make_interval(secs => :every))"),
                    {"id": row.id, "every": TOUCH_EVERY_S})
                await conn.commit()
        caller = _caller(row) if row is not None else None
        if len(self._callers) >= MAX_CACHED_KEYS:
            self._callers.clear()
        self._callers[digest] = (now + self._ttl_s, caller)
        return caller

    async def any_active(self) -> bool:
        """Whether any key is not revoked (with none, a loopback server runs requests as the local admin)."""
        now = time.monotonic()
        if self._any_active is not None and self._any_active[0] > now:
            return self._any_active[1]
        async with self._db.connect() as conn:
            found = bool((await conn.execute(text(
                "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL)"))).scalar_one())
        self._any_active = (now + self._ttl_s, found)
        return found
