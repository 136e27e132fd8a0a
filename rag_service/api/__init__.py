"""The HTTP API."""

from rag_service.api.app import create_app

__all__ = ["create_app"]
