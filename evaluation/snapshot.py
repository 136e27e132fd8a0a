"""What a run record says about the configuration it measured: a snapshot of every setting that can
change a result, the prompt and guideline versions answered with, the scorers, and a hash of it all;
plus the code version when the code runs from a git checkout.

Two runs with the same hash were made under the same configuration; settings that cannot change a
result (where the database lives, ports, secrets, timeouts of background work) are left out so
they do not make equal configurations look different.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from rag_service.config import Settings

# Settings that cannot change what a run measures, or must not be stored (keys, URLs that may carry them).
_NOT_RESULTS = frozenset({
    "environment", "log_level", "database_url", "data_dir", "db_pool_size", "db_max_overflow",
    "ingest_max_file_bytes", "ingest_batch_documents", "review_lease_s", "review_expire_after_days",
    "prompt_cache_ttl_s", "experiment_check_s", "console_session_hours", "promotion_requires_eval_run",
    "promotion_eval_tolerance", "promotion_eval_tolerances", "serve_worker", "worker_heartbeat_s",
    "job_stalled_after_s", "langfuse_host", "langfuse_public_key", "langfuse_secret_key", "host", "port",
    "embedding_api_key", "embedding_base_url", "cohere_api_key", "cohere_base_url", "llm_api_key", "llm_base_url",
})
# Versions of the scorers whose numbers a run stores: bump one when its scoring changes, so runs made
# before and after do not share a configuration hash.
SCORER_VERSIONS = {"seven_metrics": "1", "ir": "ranx", "squad": "v1.1", "ragas_offline": "0.4"}


def settings_snapshot(settings: Settings) -> dict[str, Any]:
    values = settings.model_dump(mode="json", exclude=set(_NOT_RESULTS))
    values["reranker_kind"] = settings.reranker_kind  # 'auto' resolved, as the retriever uses it
    values["llm_configured"] = settings.llm_base_url is not None
    return values


def snapshot(settings: Settings, *, embedder: str, generator: str, prompts: dict[str, int | None],
             mode: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"mode": mode, "settings": settings_snapshot(settings), "embedder": embedder, "generator": generator,
            "prompts": dict(sorted(prompts.items())), "scorers": SCORER_VERSIONS, **(extra or {})}


def config_hash(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def code_version(root: Path | None = None) -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes), or None outside a git checkout."""
    where = root or Path(__file__).resolve().parents[1]
    if not (where / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if dirty else commit
