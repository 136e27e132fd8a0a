"""The reviewer console (server-rendered Jinja2 pages at /review)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/review", include_in_schema=False)
