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


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the packages with one line added to one module."""
    for package in ("rag_service", "ingestion", "evaluation"):
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / module).open("a") as source:
        source.write(f"\n{line}  # noqa: E402, F401\n")
    return tmp_path


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    # A store importing the pipeline: only the layers contract forbids it.
    root = _copy_with(tmp_path, "rag_service/stores/base.py", "from rag_service.pipeline.executor import Plan")
    result = _lint(root)
    assert result.returncode != 0
    assert "Layers: edges -> evaluation" in result.stdout and "1 broken" in result.stdout
    assert "rag_service.stores.base -> rag_service.pipeline.executor" in result.stdout


def test_a_domain_type_importing_the_service_breaks_both_contracts(tmp_path: Path) -> None:
    root = _copy_with(tmp_path, "rag_service/domain/answers.py",
                      "from rag_service.pipeline.orchestrator import QueryPipeline")
    result = _lint(root)
    assert result.returncode != 0 and "2 broken" in result.stdout
    assert "rag_service.domain.answers -> rag_service.pipeline.orchestrator" in result.stdout
