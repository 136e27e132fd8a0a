"""The planted world of the tenant leak test (tests/test_tenants.py): two tenants, two principals,
three planted documents per tenant, and a key per reader, ingester, reviewer and admin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.test_auth import bearer, create_key

TENANTS = ("default", "acme")
PRINCIPALS = ("p1", "p2")
READERS = [(t, p) for t in TENANTS for p in PRINCIPALS]
SHARED = "quarterly ledger reconciliation"
@dataclass(frozen=True)
class Planted:
    tenant: str
    acl: str | None  # None: public
    ident: str  # for the pattern strategy (an identifier it recognises), e.g. ACM-202
    word: str  # for the keyword strategy

    @property
    def uri(self) -> str:
        return f"{self.tenant}-{self.acl or 'public'}.md"

    @property
    def text(self) -> str:
        owner = f"the {self.acl} team" if self.acl else "everyone"
        return (f"The {SHARED} for {owner} of {self.tenant} uses the code {self.ident}. "
                f"Its codeword is {self.word}, and it is filed every quarter.")

    def visible_to(self, tenant: str, principal: str) -> bool:
        return self.tenant == tenant and self.acl in (None, principal)


PLANTED = [Planted(t, acl, f"{t[:3].upper()}-{100 * (i + 1) + j}", f"zorbl{t}{acl or 'pub'}x")
           for i, t in enumerate(TENANTS) for j, acl in enumerate((None, *PRINCIPALS), start=1)]


@dataclass
class World:
    base: str
    url: str
    keys: dict[str, str]
    ids: dict[str, str] = field(default_factory=dict)  # uri -> document id
    jobs: dict[str, set[str]] = field(default_factory=dict)  # tenant -> job ids

    def get(self, path: str, key: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.base}{path}", headers=bearer(self.keys[key]), params=params, timeout=60)

    def post(self, path: str, key: str, body: Any) -> httpx.Response:
        return httpx.post(f"{self.base}{path}", headers=bearer(self.keys[key]), json=body, timeout=120)

    def visible(self, tenant: str, principal: str) -> set[str]:
        return {self.ids[d.uri] for d in PLANTED if d.visible_to(tenant, principal)}

    def hidden_tokens(self, tenant: str, principal: str) -> list[str]:
        return [token for d in PLANTED if not d.visible_to(tenant, principal) for token in (d.ident, d.word)]


def reader(tenant: str, principal: str) -> str:
    return f"{tenant}-reader-{principal}"


def keys_for(url: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for t in TENANTS:
        for p in PRINCIPALS:
            keys[reader(t, p)] = create_key(url, "reader", tenant=t, principals=[p])
        for role in ("ingester", "reviewer", "admin"):
            keys[f"{t}-{role}"] = create_key(url, role, tenant=t, principals=list(PRINCIPALS))
    return keys
