"""The span reader's checkpoint and its int8 graph, both ways: ``export_graph`` writes the graph
the package ships from a training checkpoint, ``reconstruct`` rebuilds the checkpoint from it.

Training checkpoints live under .bench-data, which a fresh checkout does not have, and the reader
took an hour of these two cores to train. The shipped graph holds every weight: the int8 matrices
with their scales (symmetric, one scale per matrix) and the rest (biases, layer norms) in full
precision. Dequantised, they make a checkpoint that ``squad_reader train --init`` can go on
training from, and that ``squad_reader export`` turns back into the same graph: dynamic
quantisation of a matrix whose largest magnitude is 127 times its old scale picks that scale again,
and so the same int8 values (``squad_reader reconstruct`` checks that the graph exported again
reads XQuAD's questions with the same spans, gaps and probabilities).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

# The quantiser's names: "<weight>_quantized", "<weight>_scale", "<weight>_zero_point".
_QUANT_PART = re.compile(r"_(quantized|scale|zero_point)$")
# A quantised MatMul's output is named after the torch module it came from.
_MODULE_OUTPUT = re.compile(r"^/(?P<module>.+)/MatMul_output_0_output_quantized$")


def dequantised(initialisers: dict[str, np.ndarray], weight: str) -> np.ndarray:
    """``weight``'s float values from its int8 matrix, scale and zero point (pure)."""
    q = initialisers[f"{weight}_quantized"].astype(np.float32)
    return (q - initialisers[f"{weight}_zero_point"].astype(np.float32)) * initialisers[f"{weight}_scale"]


def state_dict(graph: Any) -> dict[str, np.ndarray]:
    """BertForQuestionAnswering's parameters, by name, from an int8 ONNX graph (an onnx.ModelProto)
    exported by ``squad_reader export``. Pure but for reading the proto."""
    from onnx import numpy_helper

    initialisers = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    state = {name: value.copy() for name, value in initialisers.items()
             if not _QUANT_PART.search(name) and name.startswith(("bert.", "qa_outputs."))}
    for table in ("word_embeddings", "token_type_embeddings", "position_embeddings"):
        name = f"bert.embeddings.{table}.weight"
        if f"{name}_quantized" in initialisers:  # else kept in full precision, taken above
            state[name] = dequantised(initialisers, name)
    for node in graph.graph.node:
        if node.op_type != "MatMulInteger":
            continue
        found = _MODULE_OUTPUT.match(node.output[0])
        if found is None:
            raise ValueError(f"a quantised MatMul not named after its module: {node.output[0]}")
        module = found["module"].replace("/", ".")
        # ONNX multiplies by the matrix (in, out); torch's Linear keeps (out, in).
        state[f"{module}.weight"] = dequantised(initialisers, node.input[1].removesuffix("_quantized")).T.copy()
    return state


def reconstruct(graph_path: Path, target: Path) -> Path:
    """Write the checkpoint of ``graph_path`` to ``target`` (model, tokenizer, progress.json)."""
    import hashlib

    import onnx
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering

    from rag_service.providers.local_onnx import _model_dir

    config = BertConfig.from_pretrained(str(_model_dir()), attn_implementation="eager", local_files_only=True)
    config.num_labels = 2
    graph = onnx.load(str(graph_path))
    layers = {int(m[1]) for n in graph.graph.initializer if (m := re.match(r"bert\.encoder\.layer\.(\d+)\.", n.name))}
    config.num_hidden_layers = len(layers)
    model = BertForQuestionAnswering(config)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict(graph).items()},
                                                strict=False)
    # Only buffers the graph has no use for may be missing (position ids are recomputed).
    missing = [name for name in missing if not name.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"the graph does not fit the reader: missing {missing}, unexpected {unexpected}")
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(str(_model_dir()), local_files_only=True).save_pretrained(target)
    digest = hashlib.sha256(graph_path.read_bytes()).hexdigest()[:16]
    (target / "progress.json").write_text(json.dumps({"reconstructed_from": graph_path.name, "sha256": digest}))
    return target


def export_graph(checkpoint: Path, output: Path) -> None:
    """The checkpoint as the int8 ONNX graph the service reads with (providers/reader.py): exported
    with torch.onnx on a padded batch (so the attention mask stays live in the graph), then ONNX
    Runtime's dynamic quantisation of the weights to int8 (22.9 MB against 90 MB: the same short
    answers at 50% coverage on XQuAD, 2.2x faster on one thread; docs/benchmarks.md)."""
    import tempfile
    import warnings

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(str(checkpoint), attn_implementation="eager",
                                                          local_files_only=True).eval()
    ids = torch.ones((2, 16), dtype=torch.long)
    mask = torch.ones((2, 16), dtype=torch.long)
    mask[1, 8:] = 0
    axes = {0: "batch", 1: "seq"}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's notes on traced branches
        graph = Path(tmp) / "reader.onnx"
        torch.onnx.export(model, (ids, mask, torch.zeros_like(ids)), str(graph),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["start_logits", "end_logits"],
                          dynamic_axes={name: axes for name in ("input_ids", "attention_mask", "token_type_ids",
                                                                 "start_logits", "end_logits")},
                          opset_version=17, dynamo=False)
        output.parent.mkdir(parents=True, exist_ok=True)
        quantize_dynamic(str(graph), str(output), weight_type=QuantType.QInt8)


def round_trip_difference(checkpoint: Path, graph: Path, examples: list[tuple[str, str, str]]) -> float:
    """Export ``checkpoint`` again and read each (question, paragraph, answer) with it and with
    ``graph``, from the paragraph's sentence holding the answer: the largest difference in gap or
    probability. SystemExit when the two read different spans."""
    import tempfile

    from rag_service.providers.reader import OnnxSpanReader
    from rag_service.text.sentences import split_sentences

    with tempfile.TemporaryDirectory() as tmp:
        again = Path(tmp) / "again.onnx"
        export_graph(checkpoint, again)
        shipped, exported = OnnxSpanReader(graph), OnnxSpanReader(again)
        worst = 0.0
        for question, paragraph, answer in examples:
            sentence = next((s.text for s in split_sentences(paragraph) if answer in s.text), paragraph[:400])
            a, b = shipped.read(question, sentence), exported.read(question, sentence)
            worst = max(worst, abs(a.gap - b.gap), abs(a.probability - b.probability))
            if a.text != b.text:
                raise SystemExit(f"{checkpoint}: exported again, it reads {b.text!r} where the graph reads {a.text!r}")
    return worst
