"""Who is calling: an API key's role and scope, or the local admin (no key exists, loopback only)."""

from __future__ import annotations

import uuid
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

Role = Literal["reader", "ingester", "reviewer", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)

# What each role may do beyond its own name: ingesters and reviewers also read; admins do everything.
GRANTS: dict[Role, frozenset[Role]] = {
    "reader": frozenset({"reader"}),
    "ingester": frozenset({"reader", "ingester"}),
    "reviewer": frozenset({"reader", "reviewer"}),
    "admin": frozenset(ROLES),
}


class Caller(BaseModel):
    """The identity a request runs as."""

    model_config = ConfigDict(frozen=True)

    key_id: uuid.UUID | None = None  # None: the local admin (no keys exist, loopback server)
    name: str | None = None
    role: Role
    # The ACL principals the caller holds; None means unrestricted (the local admin).
    principals: tuple[str, ...] | None = None
    # Collections the key may touch; None means all.
    collections: tuple[str, ...] | None = None

    def can(self, role: Role) -> bool:
        return role in GRANTS[self.role]

    @property
    def local(self) -> bool:
        return self.key_id is None
