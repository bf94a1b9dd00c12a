"""The papers' regime on one GPU: models of their shapes with random weights, timed end to end.

Usage (a CUDA machine with torch and transformers only: no Beam, no vLLM, no package index; the
checkout's own ``inference/`` is imported from its folder when specrag is not installed):

    python benchmarks/gpu/regime.py --out benchmarks/results/gpu_regime.md     # meant for < 8 min, H100/H200
    python benchmarks/gpu/regime.py --tiny --device cpu --out -                 # tiny shapes, seconds (tests)

Three measurements, each the median of ``--reps`` after one warm run, CUDA-synchronised:

1. **Speculative RAG against standard RAG** at the paper's shapes (Mistral-7B drafter, Mixtral-8x7B
   verifier, §4): standard RAG is the verifier reading the question and all ``docs`` passages and
   generating the answer; Speculative RAG is the drafter writing ``m`` rationale-and-draft
   continuations at once, each from ``k`` passages, and the verifier scoring the ``m`` drafts in one
   forward (self-consistency and self-reflection, eq. 3-5), the best kept. A verifier that does not
   fit beside the drafter (80 GB cards) is built with the layers that fit and its times scaled by
   32/layers (said in the table).
2. **RaLMSpec against RaLMSeq** over an exact 21M-row index (the paper's Wikipedia-DPR size: 768-dim
   fp16 vectors resident on the GPU, one matmul and top-1 per search), the 7B model generating
   ``stride`` tokens per retrieval, a BERT-base query encoder over the last 32 tokens. RaLMSeq
   retrieves before every stride; RaLMSpec speculates from its local cache of retrieved passages and
   verifies ``spec_stride`` steps in one batched search, rolling back at the first mismatch. Random
   weights decide nothing real, so whether a step's speculation matches is drawn (seeded) at
   ``--accept``, the share measured on CPU (results/ralmspec.md, exact dense retrieval: 185 of 200);
   every search, encoding, forward and rollback is done for real.
3. **The engine's tokens/s**: specrag's local causal-LM engine (``LocalCausalLM.from_model``) on the 7B
   model, a batch of ``engine_batch`` prompts of ``engine_prompt`` tokens and ``engine_new`` new tokens
   each, against Hugging Face ``generate`` on the same inputs.

The report ends with one claim line: ``speculative_rag_vs_standard`` (latency ratio, paper ~0.49),
``ralmspec_vs_ralmseq`` (latency ratio), ``engine_tok_s``, ``engine_vs_hf_generate``.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
import types
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("inference",)  # what this script imports of specrag


@dataclass(frozen=True)
class Shapes:
    """Model and workload sizes; ``FULL`` are the papers', ``TINY`` run in seconds on a CPU."""

    vocab: int = 32000
    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    experts: int = 8  # Mixtral-8x7B: 8 experts, 2 per token
    encoder_hidden: int = 768  # BERT-base (DPR's query encoder)
    encoder_layers: int = 12
    encoder_heads: int = 12
    index_rows: int = 21_015_324  # DPR's Wikipedia passages
    # Speculative RAG (paper §4: 10 passages, m=5 subsets of k=2)
    question: int = 32
    doc: int = 128
    docs: int = 10
    m: int = 5
    k: int = 2
    draft: int = 96  # rationale and answer
    answer: int = 64
    reflection: int = 24  # "Do you think the rationale supports the answer, yes or no?"
    # RaLM (paper: retrieval every 4 tokens, speculation stride 3)
    ralm_tokens: int = 64
    stride: int = 4
    spec_stride: int = 3
    encoder_window: int = 32
    cache_docs: int = 20  # each retrieval caches its top passages (paper: top-k into the local cache)
    # engine
    engine_batch: int = 16
    engine_prompt: int = 1024
    engine_new: int = 64


FULL = Shapes()
TINY = Shapes(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, experts=4, encoder_hidden=32,
              encoder_layers=2, encoder_heads=2, index_rows=20_000, question=8, doc=16, draft=8, answer=8,
              reflection=4, ralm_tokens=16, encoder_window=8, cache_docs=4, engine_batch=4, engine_prompt=32,
              engine_new=8)


def import_specrag(from_checkout: bool) -> None:
    """specrag's ``inference`` layer: the installed one, or (not installed, or asked) the
    checkout's folder mapped to ``specrag.inference`` as setup.py maps it."""
    if not from_checkout:
        try:
            import specrag.inference.local_causal_lm  # noqa: F401
            return
        except ImportError:
            pass
    for name in [n for n in sys.modules if n == "specrag" or n.startswith("specrag.")]:
        del sys.modules[name]
    package = types.ModuleType("specrag")
    package.__path__ = [str(REPO / "specrag")]
    sys.modules["specrag"] = package
    for layer in LAYERS:
        spec = importlib.util.spec_from_file_location(f"specrag.{layer}", REPO / layer / "__init__.py",
                                                      submodule_search_locations=[str(REPO / layer)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        setattr(package, layer, module)


class Clock:
    """Wall time of a block, synchronised with the device."""

    def __init__(self, device):
        self.device = device

    def sync(self) -> None:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn, reps: int) -> tuple[float, object]:
        """Median seconds of ``fn()`` over ``reps`` runs after one warm run, and its last result."""
        fn()
        times, out = [], None
        for _ in range(reps):
            self.sync()
            start = time.perf_counter()
            out = fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times), out


# -- models of the papers' shapes, random weights ---------------------------------------------
def _build(config, cls, device, dtype):
    import torch
    torch.manual_seed(0)
    with torch.device(device):
        model = cls.from_config(config, dtype=dtype)
    return model.eval()


def build_lm(s: Shapes, device, dtype, *, experts: int = 0, layers: int | None = None):
    """Mistral-7B (``experts=0``) or Mixtral-8x7B shape. The end-of-text row of the output layer
    is zeroed (its logit 0, never the greedy choice): every timed generation runs its full length."""
    import torch
    from transformers import AutoModelForCausalLM, MistralConfig, MixtralConfig
    common = dict(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=layers or s.layers,
                  num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate,
                  max_position_embeddings=8192, eos_token_id=s.vocab - 1, pad_token_id=s.vocab - 1,
                  bos_token_id=1, tie_word_embeddings=False)
    config = (MixtralConfig(num_local_experts=experts, num_experts_per_tok=2, **common) if experts
              else MistralConfig(**common))
    model = _build(config, AutoModelForCausalLM, device, dtype)
    with torch.no_grad():
        model.lm_head.weight[s.vocab - 1].zero_()
    model.generation_config.eos_token_id = s.vocab - 1
    model.generation_config.pad_token_id = s.vocab - 1
    return model


def build_encoder(s: Shapes, device, dtype):
    from transformers import AutoModel, BertConfig
    config = BertConfig(vocab_size=s.vocab, hidden_size=s.encoder_hidden, num_hidden_layers=s.encoder_layers,
                        num_attention_heads=s.encoder_heads, intermediate_size=4 * s.encoder_hidden)
    return _build(config, AutoModel, device, dtype)


def verifier_layers(s: Shapes, device, dtype, headroom_gb: float = 8.0) -> int:
    """How many Mixtral layers fit in the free device memory (all of them on a 141 GB card)."""
    import torch
    if device.type != "cuda":
        return s.layers
    free, _ = torch.cuda.mem_get_info(device)
    size = torch.tensor([], dtype=dtype).element_size()
    attention = s.hidden * (2 * s.hidden + 2 * s.hidden * s.kv_heads // s.heads)
    per_layer = (attention + s.experts * 3 * s.hidden * s.intermediate) * size
    embeddings = 2 * s.vocab * s.hidden * size
    return max(1, min(s.layers, int((free - embeddings - headroom_gb * 2**30) // per_layer)))


def tokens(rows: int, length: int, vocab: int, device, seed: int):
    """Random token ids (never the end-of-text id), one generator per call: the same each run."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab - 1, (rows, length), generator=gen).to(device)


def greedy(model, ids, new_tokens: int):
    """Greedy continuation of a batch of equal-length rows with the model's KV cache: the ids."""
    import torch
    from transformers.cache_utils import DynamicCache
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    chosen = []
    for _ in range(new_tokens):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        chosen.append(token)
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
    return torch.cat(chosen, dim=1)


def sequence_logprob(model, ids, scored: int):
    """Sum of the log-probabilities of each row's last ``scored`` tokens: one forward."""
    import torch
    logits = model(input_ids=ids).logits[:, -scored - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -scored:, None]).squeeze(-1).sum(-1)


# -- 1. Speculative RAG against standard RAG ---------------------------------------------------
def speculative_rag(s: Shapes, drafter, verifier, device, clock: Clock, reps: int) -> dict:
    import torch
    question = tokens(1, s.question, s.vocab, device, 1)
    passages = tokens(s.docs, s.doc, s.vocab, device, 2)

    def standard():  # the verifier reads everything and answers
        prompt = torch.cat([passages.reshape(1, -1), question], dim=1)
        return greedy(verifier, prompt, s.answer)

    subsets = torch.arange(s.m * s.k, device=device).remainder(s.docs).reshape(s.m, s.k)
    reflection = tokens(1, s.reflection, s.vocab, device, 3).expand(s.m, -1)

    def draft():  # m drafts at once, each from k passages
        prompts = torch.cat([passages[subsets].reshape(s.m, -1), question.expand(s.m, -1)], dim=1)
        return greedy(drafter, prompts, s.draft)

    def verify(drafts):  # one scoring forward over the m drafts; the best is kept
        scored = torch.cat([question.expand(s.m, -1), drafts, reflection], dim=1)
        return int(sequence_logprob(verifier, scored, s.draft + s.reflection).argmax())

    with torch.no_grad():
        standard_s, _ = clock.time(standard, reps)
        draft_s, drafts = clock.time(draft, reps)
        verify_s, _ = clock.time(lambda: verify(drafts), reps)
    return {"standard_s": standard_s, "draft_s": draft_s, "verify_s": verify_s}


# -- 2. RaLMSpec against RaLMSeq ------------------------------------------------------------------
class ExactIndex:
    """``rows`` random unit vectors on the device (fp16 on a GPU), searched exactly: one matmul
    and top-k per batch of queries, in chunks so the score matrix stays small."""

    CHUNK = 4_000_000  # rows a search scores at once
    BUILD = 1_000_000  # rows drawn at once (fp32 while drawn: 3 GB at 768 dims)

    def __init__(self, rows: int, dim: int, device, seed: int = 0):
        import torch
        self.dtype = torch.float16 if device.type == "cuda" else torch.float32
        gen = torch.Generator(device=device).manual_seed(seed)
        self.vectors = torch.empty(rows, dim, dtype=self.dtype, device=device)
        for start in range(0, rows, self.BUILD):
            block = torch.randn(min(self.BUILD, rows - start), dim, generator=gen, device=device)
            self.vectors[start:start + len(block)] = torch.nn.functional.normalize(block, dim=1).to(self.dtype)

    def search(self, queries, k: int = 1):
        import torch
        queries = queries.to(self.dtype)
        best_scores, best_rows = None, None
        for start in range(0, len(self.vectors), self.CHUNK):
            scores = queries @ self.vectors[start:start + self.CHUNK].T
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            rows = top.indices + start
            if best_scores is None:
                best_scores, best_rows = top.values, rows
            else:
                merged = torch.cat([best_scores, top.values], 1).topk(k, dim=1)
                best_scores, best_rows = merged.values, torch.cat([best_rows, rows], 1).gather(1, merged.indices)
        return best_rows


class Ralm:
    """In-context RALM over the index: a passage prepended to the question and the answer so far."""

    def __init__(self, s: Shapes, lm, encoder, index: ExactIndex, device, accept: float, seed: int = 0):
        import torch
        self.s, self.lm, self.encoder, self.index, self.device = s, lm, encoder, index, device
        self.accept, self.seed = accept, seed
        self.question = tokens(1, s.question, s.vocab, device, 4)
        self.stats = {"searches": 0, "speculated": 0, "rollbacks": 0}
        self._torch = torch

    def passage(self, row: int):
        """A passage's tokens, fixed by its row (the index holds only vectors)."""
        return tokens(1, self.s.doc, self.s.vocab, self.device, 1000 + row)

    def encode(self, contexts):
        torch = self._torch
        window = torch.cat([c[:, -self.s.encoder_window:] for c in contexts], 0)
        hidden = self.encoder(input_ids=window).last_hidden_state.mean(1)
        return torch.nn.functional.normalize(hidden.float(), dim=1)

    def step(self, row: int, answer):
        """``stride`` new tokens from the passage of ``row``, the question and the answer so far."""
        torch = self._torch
        prompt = torch.cat([self.passage(row), self.question, answer], dim=1)
        return torch.cat([answer, greedy(self.lm, prompt, self.s.stride)], dim=1)

    def ralmseq(self):
        torch = self._torch
        answer = self.question[:, :0]
        while answer.shape[1] < self.s.ralm_tokens:
            context = torch.cat([self.question, answer], 1)
            row = int(self.index.search(self.encode([context]))[0, 0])
            self.stats["searches"] += 1
            answer = self.step(row, answer)
        return answer

    def ralmspec(self):
        """Speculate ``spec_stride`` steps from the local cache, verify them in one batched search,
        redo from the first step whose speculation is drawn a mismatch with the verified passage."""
        torch = self._torch
        draws = torch.Generator().manual_seed(self.seed)
        answer = self.question[:, :0]
        context = self.question
        first = self.index.search(self.encode([context]), k=self.s.cache_docs)[0]
        self.stats["searches"] += 1
        cache = first.tolist()
        row = cache[0]
        answer = self.step(row, answer)
        while answer.shape[1] < self.s.ralm_tokens:
            queries, steps = [], []
            for _ in range(self.s.spec_stride):
                if answer.shape[1] >= self.s.ralm_tokens:
                    break
                query = self.encode([torch.cat([self.question, answer], 1)])  # once: speculation and check
                cached = self.index.vectors[torch.tensor(cache, device=self.device)]
                spec = cache[int((query.to(cached.dtype) @ cached.T).argmax())]
                queries.append(query)
                steps.append((spec, answer))
                answer = self.step(spec, answer)
                self.stats["speculated"] += 1
            verified = self.index.search(torch.cat(queries), k=self.s.cache_docs)
            self.stats["searches"] += 1
            for i, (spec, before) in enumerate(steps):
                true_rows = verified[i].tolist()
                cache = list(dict.fromkeys(cache + true_rows))
                if torch.rand((), generator=draws) >= self.accept:  # a mismatch: redo from here
                    self.stats["rollbacks"] += 1
                    answer = self.step(true_rows[0], before)
                    break
        return answer[:, :self.s.ralm_tokens]


def ralm(s: Shapes, lm, encoder, index: ExactIndex, device, clock: Clock, reps: int, accept: float) -> dict:
    import torch
    with torch.no_grad():
        seq = Ralm(s, lm, encoder, index, device, accept)
        seq_s, _ = clock.time(seq.ralmseq, reps)
        spec = Ralm(s, lm, encoder, index, device, accept)
        spec_s, _ = clock.time(spec.ralmspec, reps)
        single = torch.nn.functional.normalize(torch.randn(1, s.encoder_hidden, device=device), dim=1)
        batched = single.expand(s.spec_stride, -1)
        search_1, _ = clock.time(lambda: index.search(single), reps)
        search_s, _ = clock.time(lambda: index.search(batched), reps)
    runs = reps + 1
    return {"ralmseq_s": seq_s, "ralmspec_s": spec_s, "search_1_ms": 1000 * search_1, "search_s_ms": 1000 * search_s,
            "seq_searches": seq.stats["searches"] / runs, "spec_searches": spec.stats["searches"] / runs,
            "speculated": spec.stats["speculated"] / runs, "rollbacks": spec.stats["rollbacks"] / runs}


# -- 3. the engine's tokens/s ----------------------------------------------------------------------
def word_tokenizer(vocab: int):
    """A tokenizer whose word ``w<i>`` is token ``i``: prompts of given ids without a hub download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = {f"w{i}": i for i in range(vocab)}
    raw = Tokenizer(models.WordLevel(words, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="w0", eos_token=f"w{vocab - 1}")


def engine(s: Shapes, lm, device, dtype_name: str, clock: Clock, reps: int) -> dict:
    import torch
    from specrag.inference.local_base import LocalModelConfig
    from specrag.inference.local_causal_lm import LocalCausalLM
    from specrag.inference.types import GenerateRequest
    ids = tokens(s.engine_batch, s.engine_prompt, s.vocab, "cpu", 5)
    prompts = [" ".join(f"w{i}" for i in row.tolist()) for row in ids]
    ours = LocalCausalLM.from_model(lm, word_tokenizer(s.vocab), LocalModelConfig(
        "random-7b", dtype=dtype_name, device=str(device), max_prompt_tokens=s.engine_prompt + 8))
    requests = [GenerateRequest(p, max_new_tokens=s.engine_new, chat=False) for p in prompts]
    with torch.no_grad():
        engine_s, generations = clock.time(lambda: ours.generate(requests), reps)
        batch = ids.to(device)
        hf_s, hf_out = clock.time(lambda: lm.generate(
            input_ids=batch, attention_mask=torch.ones_like(batch), max_new_tokens=s.engine_new,
            min_new_tokens=s.engine_new, do_sample=False), reps)
    produced = sum(len(g.token_ids) for g in generations)
    same = sum(g.token_ids == row[s.engine_prompt:].tolist() for g, row in zip(generations, hf_out.cpu()))
    total = s.engine_batch * (s.engine_prompt + s.engine_new)
    return {"engine_s": engine_s, "hf_s": hf_s, "engine_tok_s": total / engine_s, "hf_tok_s": total / hf_s,
            "new_tokens": produced, "same_as_hf": same}


# -- the run ---------------------------------------------------------------------------------------
def run(s: Shapes, device, dtype_name: str, reps: int, accept: float) -> tuple[list[str], str]:
    import torch
    dtype = getattr(torch, dtype_name)
    clock = Clock(device)
    started = time.perf_counter()
    lines = []
    drafter = build_lm(s, device, dtype)
    layers = verifier_layers(s, device, dtype)
    verifier = build_lm(s, device, dtype, experts=s.experts, layers=layers)
    scale = s.layers / layers
    spec = speculative_rag(s, drafter, verifier, device, clock, reps)
    del verifier
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    standard_s, verify_s = spec["standard_s"] * scale, spec["verify_s"] * scale  # the verifier's own times
    speculative_s = spec["draft_s"] + verify_s
    lines += ["| measurement | value |", "|---|---|",
              f"| verifier layers built | {layers} of {s.layers}{f' (its times x{scale:.2f})' if scale != 1 else ''} |",
              f"| standard RAG (verifier, {s.docs} passages, {s.answer} new tokens) | {standard_s:.3f} s |",
              f"| Speculative RAG: drafting ({s.m} drafts x {s.draft} tokens, {s.k} passages each) | "
              f"{spec['draft_s']:.3f} s |",
              f"| Speculative RAG: verifying ({s.m} drafts, one forward) | {verify_s:.3f} s |",
              f"| Speculative RAG in all | {speculative_s:.3f} s |"]
    encoder = build_encoder(s, device, dtype)
    index = ExactIndex(s.index_rows, s.encoder_hidden, device)
    r = ralm(s, drafter, encoder, index, device, clock, reps, accept)
    del index, encoder
    gc.collect()
    lines += [f"| exact search, {s.index_rows:,} rows x {s.encoder_hidden}: 1 query / {s.spec_stride} queries | "
              f"{r['search_1_ms']:.2f} / {r['search_s_ms']:.2f} ms |",
              f"| RaLMSeq ({s.ralm_tokens} tokens, a search every {s.stride}) | {r['ralmseq_s']:.3f} s, "
              f"{r['seq_searches']:.0f} searches |",
              f"| RaLMSpec (speculation stride {s.spec_stride}, acceptance drawn at {accept}) | {r['ralmspec_s']:.3f} s, "
              f"{r['spec_searches']:.1f} searches, {r['speculated']:.1f} speculated steps, "
              f"{r['rollbacks']:.1f} rollbacks |"]
    e = engine(s, drafter, device, dtype_name, clock, reps)
    lines += [f"| specrag engine, {s.engine_batch} x ({s.engine_prompt} + {s.engine_new}) tokens | {e['engine_s']:.3f} s, "
              f"{e['engine_tok_s']:,.0f} tokens/s |",
              f"| HF generate, the same | {e['hf_s']:.3f} s, {e['hf_tok_s']:,.0f} tokens/s "
              f"({e['same_as_hf']}/{s.engine_batch} rows the same tokens) |",
              f"| wall time of this run | {time.perf_counter() - started:.0f} s |"]
    claim = (f"speculative_rag_vs_standard={speculative_s / standard_s:.2f} "
             f"ralmspec_vs_ralmseq={r['ralmspec_s'] / r['ralmseq_s']:.2f} engine_tok_s={e['engine_tok_s']:.0f} "
             f"engine_vs_hf_generate={e['hf_s'] / e['engine_s']:.2f}")
    return lines, claim


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="-", help="the results file (markdown), or - for stdout only")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU test of the script)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--accept", type=float, default=0.925,
                    help="RaLMSpec's share of matching speculations (CPU, exact dense: 185/200)")
    ap.add_argument("--index-rows", type=int, default=None, help="override the index size")
    ap.add_argument("--from-checkout", action="store_true", help="import specrag's inference/ from this checkout")
    args = ap.parse_args(argv)
    import torch
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("regime.py: no CUDA device here; use --tiny --device cpu to test the script")
    import_specrag(args.from_checkout)
    torch.manual_seed(0)
    torch.set_num_threads(1 if device.type == "cpu" else torch.get_num_threads())
    shapes = TINY if args.tiny else FULL
    if args.index_rows:
        shapes = replace(shapes, index_rows=args.index_rows)
    lines, claim = run(shapes, device, args.dtype, args.reps, args.accept)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    import transformers
    header = [f"# The papers' regime on one GPU{' (tiny shapes)' if args.tiny else ''}", "",
              f"Command: `python benchmarks/gpu/regime.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
              f"Device: {name}, torch {torch.__version__}, transformers {transformers.__version__}, {args.dtype}, "
              f"random weights; medians of {args.reps} after one warm run. "
              f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    report = "\n".join(header + lines + ["", claim]) + "\n"
    print(report)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
