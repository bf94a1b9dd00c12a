"""vLLM backend: a causal LM's generate and score served by vLLM's engine.

vLLM batches continuously: requests join and leave its running batch at every step, its paged KV
cache reuses the blocks of a prefix it has seen (automatic prefix caching), and its CPU and GPU
kernels are the field's. This backend hands it each row as its own request the moment the
engine's batcher releases it (rows of a micro-batch go out at once, several batches in flight),
so vLLM, not specrag's micro-batches, decides what runs together.

Prompts are tokenised here, with the model's own tokenizer and chat template as the local backend
does (``local_base.prompt_token_ids``), and sent as token ids: both backends feed the model the
same ids. ``generate`` returns the chosen tokens' ids and log-probabilities; ``score`` reads the
continuation's log-probabilities from vLLM's prompt log-probabilities. What vLLM does not serve
— fused decoding over weighted streams (AED-RAG), denoising (SARDI), a hidden state and the full
next-token distribution (KNN-LM), contrastive scoring (it needs two full distributions) — is not
declared, so a method that needs it is refused at start.

Encoders (a dense retriever's embedder) run on the local backend unless ``VllmConfig(embed=True)``
(``--vllm-embed``): then vLLM's pooling runner serves ``embed`` too, from a server of the
encoder's own. Off by default because on a CPU a 22M-parameter embedder is cheaper in the
worker than a 2.5 GB server beside it; on a GPU, with a large embedder, it is the other way.
The ids are the local encoder's (its tokenizer, truncated to the same length); the vectors
equal the local backend's to float32 rounding (``tests/models/test_vllm.py``).

The server is vLLM's OpenAI-compatible one: started per worker process and model from
``.venv-vllm`` (``vllm_server.py``), or a running one given by ``--vllm-url`` (a GPU deployment).

Example usage::

    backend = VllmBackend.open("smollm2-135m-instruct", BackendSettings(dtype="bfloat16"))
    [g] = backend.generate([GenerateRequest("Who wrote Hamlet?", max_new_tokens=16)])
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from specrag.inference.capabilities import EMBED, GENERATE, SCORE
from specrag.inference.client_loop import ClientLoop
from specrag.inference.engine import BackendSettings, ModelBackend
from specrag.inference.types import GenerateRequest, Generation, ScoreRequest, Scored


class VllmError(RuntimeError):
    """A request vLLM refused or failed (its own message is included)."""


class VllmUnavailable(VllmError):
    """The server could not be reached, or stayed overloaded, through every retry."""


class VllmTimeout(VllmError, TimeoutError):
    """A request ran past its timeout."""


CPU_BLOCK_SIZE = 128  # vLLM's own KV block on a CPU: its prefix cache serves whole blocks only


@dataclass(frozen=True)
class VllmConfig:
    """Where the engine runs and how patient to be with it."""

    url: str | None = None  # a running vLLM OpenAI server; None: one per worker process and model
    timeout_s: float = 300.0
    retries: int = 3  # on unreachable / overloaded, with backoff backoff_s * 2**attempt
    backoff_s: float = 0.5
    kv_cache_gb: int = 1  # a started server's paged KV cache (VLLM_CPU_KVCACHE_SPACE)
    max_num_seqs: int = 64  # a started server's sequences per engine step
    eager: bool = False  # a started server skips torch.compile (starts in seconds, runs slower)
    max_inflight_batches: int = 64  # engine batches of one model in flight at once
    embed: bool = False  # encoders' embed on vLLM's pooling runner too (else they run locally)
    # a batch-invariant row (a RaLM step) reuses the cached blocks of rows with the same prompt (same
    # question and document) instead of prefilling it again: exact in every run measured, not by
    # construction (docs/guide/vllm.md)
    step_cache: bool = False
    # tokens per KV block of a started server (None: vLLM's own, CPU_BLOCK_SIZE on a CPU). Only whole blocks are
    # cached, so a RaLM step recomputes the tail of its prompt past the last whole block: smaller
    # blocks leave less to recompute (a results file, not this default, says what pays)
    block_size: int | None = None

    def __post_init__(self):
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0 or self.max_inflight_batches < 1:
            raise ValueError("vllm: timeout_s > 0, retries >= 0, backoff_s >= 0, max_inflight_batches >= 1")
        if self.block_size is not None and (self.block_size < 1 or self.block_size & (self.block_size - 1)):
            raise ValueError(f"--vllm-block-size must be a power of two, got {self.block_size}")
        if self.block_size is not None and self.url:
            raise ValueError("--vllm-block-size sets up a server the backend starts; a --vllm-url server has "
                             "its own (vLLM's --block-size): leave one of them out")
        if self.embed and self.url:
            raise ValueError("--vllm-embed starts an embedding server per worker beside the generator's; a "
                             "--vllm-url server serves one model: leave one of them out")


class _Client:
    """One client loop and HTTP session per process, shared by every vLLM model."""

    _lock = threading.Lock()
    _instance: "_Client | None" = None

    @classmethod
    def get(cls) -> "_Client":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self):
        self.loop = ClientLoop("vllm-client")
        self.session = self.loop.run(self._session())

    @staticmethod
    async def _session():
        import aiohttp
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    @classmethod
    def close(cls) -> None:
        with cls._lock:
            inst, cls._instance = cls._instance, None
        if inst is not None:
            inst.loop.stop(inst.session.close())


atexit.register(_Client.close)


class _Gate:
    """Rows that must not share the engine's batch (``GenerateRequest.batch_invariant``: vLLM has
    no batch-invariant kernels on CPU) wait until no other row of this backend is in the engine,
    and hold the others back while they run; every other row shares the batch freely."""

    def __init__(self):
        self._cond: asyncio.Condition | None = None  # made on the client loop, at first use
        self._shared, self._alone = 0, False

    @contextlib.asynccontextmanager
    async def enter(self, alone: bool):
        self._cond = self._cond or asyncio.Condition()
        async with self._cond:
            await self._cond.wait_for(lambda: not self._alone and (not alone or self._shared == 0))
            if alone:
                self._alone = True
            else:
                self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                if alone:
                    self._alone = False
                else:
                    self._shared -= 1
                self._cond.notify_all()


class VllmBackend(ModelBackend):
    """ModelBackend for one causal LM served by vLLM (or, with ``embed``, one encoder)."""

    supports_row_errors = True
    fallback = "local"  # a vllm run's other models (cross-encoders, denoisers, encoders by default) run there

    @classmethod
    def add_options(cls, flag) -> None:
        flag("url", help="http://host:port of a running vLLM OpenAI server (default: the vllm backend starts one "
                         "per worker process and model from .venv-vllm)")
        flag("kv_cache_gb", type=int, default=1, help="the paged KV cache of each vLLM server the backend starts, GiB")
        flag("embed", action="store_true",
             help="with --backend vllm, embed with vLLM's pooling runner too (a server of the embedder's own; "
                  "default: the embedder runs in the worker)")
        flag("step_cache", action="store_true",
             help="with --backend vllm, a RaLM step reuses vLLM's cached blocks of its own prompt (the question "
                  "and document) instead of prefilling it again: RaLMSeq 1.37x faster, RaLMSpec equal to it in "
                  "every run measured, not by construction (docs/guide/vllm.md)")
        flag("block_size", type=int, default=None,
             help="tokens per KV-cache block of each vLLM server the backend starts (default: vLLM's, 128 on "
                  "a CPU, where its attention needs a multiple of 32); only whole blocks are reused, so "
                  "--vllm-step-cache reuses more with smaller ones")

    @classmethod
    def config_from_options(cls, value, chosen: bool) -> VllmConfig | None:
        if chosen or value("url"):
            return VllmConfig(url=value("url"), kv_cache_gb=value("kv_cache_gb"), embed=value("embed"),
                              step_cache=value("step_cache"), block_size=value("block_size"))
        for name in ("embed", "step_cache", "block_size"):
            if value(name) not in (None, False):
                raise ValueError(f"--vllm-{name.replace('_', '-')} is an option of --backend vllm")
        return None

    @classmethod
    def identity_extras(cls, settings: BackendSettings) -> dict[str, Any]:
        vllm = settings.config_of(VllmConfig)
        # vLLM's pooling kernels: the same vectors to float32 rounding, not bit for bit; a step whose
        # prompt is cached runs other kernels than one prefilled whole
        return {**({"embed_backend": "vllm"} if vllm is not None and vllm.embed else {}),
                **({"vllm_step_cache": True} if vllm is not None and vllm.step_cache else {}),
                **({"vllm_block_size": vllm.block_size} if vllm is not None and vllm.block_size else {})}

    @classmethod
    def serves(cls, model: str, settings: BackendSettings | None = None) -> frozenset[str]:
        from specrag.inference.models import model_spec
        kind = model_spec(model).kind
        if kind == "causal-lm":
            return frozenset({GENERATE, SCORE})
        vllm = settings.config_of(VllmConfig) if settings is not None else None
        return frozenset({EMBED}) if kind == "encoder" and vllm is not None and vllm.embed else frozenset()

    @classmethod
    def open(cls, model: str, settings: BackendSettings) -> "VllmBackend":
        return cls(model, settings.config_of(VllmConfig) or VllmConfig(), dtype=settings.dtype,
                   threads=settings.num_threads)

    def __init__(self, model: str, config: VllmConfig = VllmConfig(), *, dtype: str = "float32", threads: int = 1):
        from transformers import AutoTokenizer, GenerationConfig

        from specrag.inference.models import materialise, model_spec
        from specrag.wording import a
        spec = model_spec(model)
        self.capabilities = self.serves(model, BackendSettings(threads, dtype, configs=(config,)))
        if not self.capabilities:
            raise ValueError(f"the vllm backend serves causal LMs (and encoders with --vllm-embed); {model} is "
                             f"{a(spec.kind)} model")
        self.name, self.config = model, config
        self.embeds = EMBED in self.capabilities
        self.max_inflight_batches = config.max_inflight_batches
        folder = materialise(model)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.instruct = spec.chat is not False and bool(self.tokenizer.chat_template)
        try:
            eos = GenerationConfig.from_pretrained(folder).eos_token_id
        except OSError:  # no generation_config.json
            eos = None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self._eos = sorted(set(eos))
        self.server = None
        if config.url:
            self.url = config.url.rstrip("/")
        else:
            from specrag.inference.local_encoder import EMBED_MAX_TOKENS
            from specrag.inference.vllm_server import VllmServer, VllmServerConfig
            self.server = VllmServer(VllmServerConfig(
                model, str(folder), dtype=dtype, threads=threads, kv_cache_gb=config.kv_cache_gb,
                max_num_seqs=config.max_num_seqs, eager=config.eager, embed=self.embeds, block_size=config.block_size,
                max_model_len=EMBED_MAX_TOKENS if self.embeds else VllmServerConfig.max_model_len)).start()
            atexit.register(self.server.stop)
            self.url = self.server.url
        self._client = _Client.get()
        self._gate = _Gate()
        self._namespace = ""  # mixed into every cache salt once clear_prefix_cache has been called

    # -- tokenisation (the local backend's, so both feed the model the same ids) -----------
    @property
    def eos_ids(self) -> list[int]:
        return list(self._eos)

    def prompt_ids(self, prompt: str, chat: bool) -> list[int]:
        from specrag.inference.local_base import prompt_token_ids
        return prompt_token_ids(self.tokenizer, prompt, chat and self.instruct)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def detokenize(self, ids: list[list[int]]) -> list[str]:
        return [self.tokenizer.decode(list(i), skip_special_tokens=True) for i in ids]

    # -- operations --------------------------------------------------------------------------
    def generate(self, requests: list[GenerateRequest], return_exceptions: bool = False) -> list[Generation]:
        return self._call(requests, self._generate, return_exceptions)

    def score(self, requests: list[ScoreRequest], return_exceptions: bool = False) -> list[Scored]:
        return self._call(requests, self._score, return_exceptions)

    def embed(self, texts: list[str], return_exceptions: bool = False):
        """L2-normalised embeddings, one row per text (vLLM pools as the model's sentence-transformers
        config says, as the local encoder does)."""
        rows = self._call(list(texts), self._embed, return_exceptions)
        if return_exceptions:
            return rows
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def cancel(self, requests: list) -> None:
        """Close the requests of rows nobody waits for (vLLM aborts a request whose client left)."""
        self._client.loop.abandon(requests)

    def clear_prefix_cache(self) -> None:
        """Start from an empty prefix cache, as a new worker would (benchmarks compare variants):
        requests from now on carry a salt of a fresh namespace, so none reuses the blocks of an
        earlier one. A server the backend shares with others is not reset (vLLM's own reset is a
        development endpoint); its blocks only age out."""
        self._namespace = uuid.uuid4().hex

    def _call(self, rows: list, call, return_exceptions: bool) -> list:
        return self._client.loop.run_rows(rows, call, return_exceptions)

    async def _generate(self, r: GenerateRequest) -> Generation:
        prompt = self.prompt_ids(r.prompt, r.chat) + list(r.continuation_ids)
        body = {"prompt": prompt, "max_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p,
                "seed": r.seed, "stop": list(r.stop), "stop_token_ids": self._eos, "logprobs": 0,
                "return_tokens_as_token_ids": True, "skip_special_tokens": True}
        if r.batch_invariant:  # alone; computed afresh, as a cached prefix's KV came from another shape
            # (with step_cache: from the rows of the same prompt, a RaLM request's earlier steps)
            head = repr(prompt[:len(prompt) - len(r.continuation_ids)])
            body["cache_salt"] = hashlib.sha256((self._namespace + head).encode()).hexdigest()[:32] \
                if self.config.step_cache else uuid.uuid4().hex
        elif self._namespace:
            body["cache_salt"] = self._namespace
        async with self._gate.enter(alone=r.batch_invariant):
            data = await self._post(body)
        choice = data["choices"][0]
        ids = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
        lps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        while ids and ids[-1] in self._eos:  # EOS is not part of the text (as the local backend)
            ids.pop()
            lps.pop()
        finish = "stop" if choice["finish_reason"] == "stop" else "length"
        # a server started here reports them; one given by --vllm-url only with --enable-prompt-tokens-details
        cached = ((data.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        return Generation(choice["text"], ids, lps, len(prompt), finish, cached)

    async def _score(self, r: ScoreRequest) -> Scored:
        if r.contrast_prompt is not None:
            raise VllmError("contrastive scoring needs two full next-token distributions, which vLLM does not "
                            "return: use the local or triton backend")
        prompt = self.prompt_ids(r.prompt, r.chat)
        pieces = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in r.segments or (r.continuation,)]
        cont = [i for piece in pieces for i in piece]
        if not cont:
            raise ValueError("score: empty continuation")
        body = {"prompt": prompt + cont, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        if self._namespace:
            body["cache_salt"] = self._namespace
        async with self._gate.enter(alone=False):
            positions = (await self._post(body))["choices"][0]["prompt_logprobs"][len(prompt):]
        lps = [float(pos[str(token)]["logprob"]) for pos, token in zip(positions, cont)]
        return Scored(lps, len(prompt), self.tokenizer.convert_ids_to_tokens(cont),
                      [len(p) for p in pieces] if r.segments else [])

    async def _embed(self, text: str) -> np.ndarray:
        from specrag.inference.local_encoder import EMBED_MAX_TOKENS
        ids = self.tokenizer(text, truncation=True, max_length=EMBED_MAX_TOKENS)["input_ids"]
        async with self._gate.enter(alone=False):
            data = await self._post({"input": [ids], "encoding_format": "float"}, "/v1/embeddings")
        return np.asarray(data["data"][0]["embedding"], dtype=np.float32)

    async def _post(self, body: dict, path: str = "/v1/completions") -> dict:
        import aiohttp
        cfg = self.config
        body = {"model": self.name, **body}
        for attempt in range(cfg.retries + 1):
            try:
                async with self._client.session.post(f"{self.url}{path}", json=body,
                                                   timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as resp:
                    if resp.status in (429, 503) and attempt < cfg.retries:
                        raise ConnectionError(f"HTTP {resp.status}")
                    data = await resp.json(content_type=None)
                    if resp.status != 200:
                        message = data.get("message") or data.get("error", {}).get("message") or data
                        raise VllmError(f"vLLM {self.name}: HTTP {resp.status}: {message}")
                    return data
            except (asyncio.TimeoutError, TimeoutError) as e:
                raise VllmTimeout(f"vLLM {self.name}: no answer within {cfg.timeout_s:g}s ({self.url})") from e
            except (aiohttp.ClientConnectionError, ConnectionError) as e:
                # a dead server's group is stopped off the client loop: it may take seconds
                code = await asyncio.get_running_loop().run_in_executor(None, self.server.exited) \
                    if self.server else None
                if code is not None:  # no retry brings it back
                    raise VllmUnavailable(f"vLLM {self.name}: its server exited with code {code}; log "
                                          f"{self.server.log_path}") from e
                if attempt == cfg.retries:
                    raise VllmUnavailable(f"vLLM {self.name}: server at {self.url} unavailable after "
                                          f"{cfg.retries + 1} attempts: {e}") from e
                await asyncio.sleep(cfg.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")
