"""The layer contracts in pyproject.toml hold, and an import against the arrows breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_layer_contracts_hold() -> None:
    result = _lint(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_build(tmp_path: Path) -> None:
    # A copy of the packages with one deliberate violation: a domain type importing the pipeline.
    for package in ("rag_service", "ingestion", "evaluation"):
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "rag_service" / "domain" / "answers.py").open("a") as module:
        module.write("\nfrom rag_service.pipeline.orchestrator import QueryPipeline  # noqa: E402, F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "rag_service.domain.answers -> rag_service.pipeline.orchestrator" in result.stdout
