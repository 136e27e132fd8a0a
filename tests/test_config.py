"""Settings: defaults, coercion, and errors that name the variable to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_service.config import get_settings, load_settings
from rag_service.errors import ConfigError
from rag_service.redaction import hide_password


def test_defaults_use_the_embedded_database() -> None:
    settings = load_settings()
    assert settings.database_url is None and settings.embedded_database
    assert settings.embedding_dimension == 384 and settings.embedding_provider == "local"


@pytest.mark.parametrize("given", [
    "postgres://u:p@h:5432/d", "postgresql://u:p@h:5432/d", "postgresql+psycopg2://u:p@h:5432/d",
])
def test_database_url_is_coerced_to_psycopg3(given: str) -> None:
    assert load_settings(database_url=given).database_url == "postgresql+psycopg://u:p@h:5432/d"


def test_environment_and_dotenv_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("RAGSVC_HNSW_EF_SEARCH=77\nRAGSVC_LOG_LEVEL=DEBUG\n")
    monkeypatch.setenv("RAGSVC_LOG_LEVEL", "WARNING")  # the environment wins over .env
    settings = get_settings()
    assert settings.hnsw_ef_search == 77
    assert settings.log_level == "WARNING"
    assert get_settings() is settings  # cached


@pytest.mark.parametrize("env, value, fragment", [
    ("RAGSVC_PORT", "eighty", "RAGSVC_PORT"),
    ("RAGSVC_PORT", "70000", "RAGSVC_PORT"),
    ("RAGSVC_EMBEDDING_DIMENSION", "0", "RAGSVC_EMBEDDING_DIMENSION"),
    ("RAGSVC_EMBEDDING_DIMENSION", "3072", "RAGSVC_EMBEDDING_DIMENSION"),
    ("RAGSVC_CHUNK_OVERLAP", "300", "RAGSVC_CHUNK_OVERLAP"),
    ("RAGSVC_LOG_LEVEL", "LOUD", "RAGSVC_LOG_LEVEL"),
    ("RAGSVC_DATABASE_URL", "mysql://u:secret@h/d", "RAGSVC_DATABASE_URL"),
    ("RAGSVC_TEXT_SEARCH_CONFIG", "english; drop table x", "RAGSVC_TEXT_SEARCH_CONFIG"),
    ("RAGSVC_EMBEDDING_PROVIDER", "openai", "RAGSVC_EMBEDDING_BASE_URL"),
])
def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str, fragment: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as err:
        get_settings()
    assert fragment in str(err.value)
    assert "secret" not in str(err.value)


def test_api_keys_are_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("RAGSVC_PORT", "-1")
    with pytest.raises(ConfigError) as err:
        get_settings()
    assert "sk-very-secret" not in str(err.value)
    monkeypatch.delenv("RAGSVC_PORT")
    assert "sk-very-secret" not in repr(load_settings(llm_api_key="sk-very-secret"))


def test_hide_password() -> None:
    assert hide_password("postgresql+psycopg://u:pw@h:5432/d") == "postgresql+psycopg://u:***@h:5432/d"
    assert hide_password("postgresql://postgres:@/db?host=/tmp") == "postgresql://postgres:@/db?host=/tmp"
    assert hide_password("postgresql://u@h/d?sslmode=require&password=s3cret") == (
        "postgresql://u@h/d?sslmode=require&password=***")


def test_production_refuses_the_embedded_database() -> None:
    with pytest.raises(ConfigError, match="RAGSVC_DATABASE_URL"):
        load_settings(environment="production")
    settings = load_settings(environment="production", database_url="postgresql://u:p@db:5432/rag")
    assert not settings.embedded_database
