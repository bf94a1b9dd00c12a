"""RaLMSpec vs RaLMSeq: per-request latency split into generation and retrieval (paper Fig. 4, Table 5).

Usage (from the repository root, after `make install`):

    .venv/bin/python benchmarks/ralmspec.py [--questions 20] [--edr-vectors 2000000] [--dtype bfloat16]

Serves NQ questions one request at a time (the paper's latency setting) with RaLMSeq and
RaLMSpec, +P, +S, +A, +PSA (the paper's variants: they always speculate) and +F, +PSAF
(specrag's default: the cost model of methods/os3.py takes sequential steps where speculation
cannot pay) over three retrievers:
- EDR, exact dense: FAISS flat over the pooled corpus's MiniLM vectors, padded with random unit
  vectors to ``--edr-vectors`` so one exact search costs about one generation step (the table
  says how often a padding row won; they score ~0.25 against queries, real passages 0.4-0.8);
- ADR, approximate dense: HNSW over the pooled corpus;
- SR, sparse: bm25s over the pooled corpus (and ``lucene`` in --retrievers: Lucene BM25 via pyserini);
and KNN-LM over a datastore of the pooled corpus (``--knnlm-entries``, Beam job) for each
k in ``--knnlm-k``, exact (flat L2) and approximate (HNSW). Every RaLMSpec variant's output is compared with RaLMSeq's token for token.

At the papers' scale: ``--scale-index`` (benchmarks/scale_corpus.py: the pooled corpus plus
generated distractors; several, comma-separated: each kind from the first that has it, e.g. EDR
from a 5M dense build and SR from a 1M bm25 one) for EDR/ADR/SR/lucene, ``cheap`` in --retrievers for bm25s over the pooled
corpus alone (RaLMSeq and +F: where speculation cannot pay), ``--knnlm-extend-to`` for the exact
KNN-LM search over the real datastore extended with generated entries. A search-cost table (one
search of s questions against one) precedes the speed-ups. Each variant's measured requests are
kept under $SPECRAG_BENCH_DIR (by index, method settings, dtype and prefix-cache size), so a stopped
run resumes where it stopped; they are reused whatever the code, so delete measured-ralmspec/ and
measured-knnlm/ there to measure a changed engine again. Writes
benchmarks/results/ralmspec.md; the last line is
`edr_speedup=<r> adr_speedup=<r> sr_speedup=<r> knnlm_edr_speedup=<r> knnlm_adr_speedup=<r>
cheap_bm25_ratio=<r> identical=<true|false> backend=<b> edr_ceiling=<r> edr_share_of_ceiling=<r>`
(speed-ups are the best of RaLMSpec+PSA and +PSAF over RaLMSeq in mean latency, KNN-LM's the best
variant's; cheap_bm25_ratio is +F's over bm25s).

``--backends local,vllm`` measures every row on the embedded engine and on vLLM in one sitting
(the claim line speaks for vLLM, the table for both). Each row has RaLMSeq's retrieval share r
of its latency, the ceiling 1 / (1 - r) of a variant that gives RaLMSeq's tokens (it can save
only retrieval) and the share of that possible gain reached, (speed-up - 1) / (ceiling - 1)
(``specrag compare``'s rule, `evaluation/compare_report.retrieval_ceiling`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
PAPER = {"sequential_fallback": False}  # the paper's RaLMSpec always speculates
VARIANTS = [("RaLMSeq", "ralmseq", {}), ("RaLMSpec", "ralmspec", PAPER),
            ("RaLMSpec+P", "ralmspec", {"prefetch": True, **PAPER}), ("RaLMSpec+S", "ralmspec", {"os3": True, **PAPER}),
            ("RaLMSpec+A", "ralmspec", {"async_verification": True, **PAPER}),
            ("RaLMSpec+PSA", "ralmspec", {"prefetch": True, "os3": True, "async_verification": True, **PAPER}),
            # specrag's default: the cost model falls back to sequential steps where speculation cannot pay
            ("RaLMSpec+F", "ralmspec", {}),
            ("RaLMSpec+PSAF", "ralmspec", {"prefetch": True, "os3": True, "async_verification": True})]
AGAIN = ("RaLMSeq (again)", "ralmseq", {})  # --baseline-again: the baseline served once more, last
KNNLM_VARIANTS = [("KNN-LM", "knnlm", {}), ("RaLMSpec", "knnlm-spec", PAPER),
                  ("RaLMSpec+S", "knnlm-spec", {"os3": True, **PAPER}), ("RaLMSpec+SF", "knnlm-spec", {"os3": True})]


def padded_flat_index(source: Path, out: Path, total: int, seed: int = 0) -> dict:
    """The pooled corpus's flat index padded with random unit vectors up to ``total`` rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.retrieval.dense import VECTORS, build_faiss
    from specrag.schemas.tables import PASSAGES
    real = np.load(source / VECTORS)
    pads = max(total - len(real), 0)
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((pads, real.shape[1]), dtype=np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / VECTORS, np.concatenate([real, noise]))
    passages = pq.read_table(source / "passages.parquet")
    pad_rows = pa.table({"id": [f"~pad-{i:08d}" for i in range(pads)], "title": [""] * pads,
                         "text": ["(padding)"] * pads}).cast(passages.schema)
    pq.write_table(pa.concat_tables([passages, pad_rows]).cast(PASSAGES), out / "passages.parquet")
    params = build_faiss(np.load(out / VECTORS, mmap_mode="r"), out / "dense", "flat")
    manifest = {"kinds": {"dense": {**params, "embedder": "all-minilm-l6-v2"}}, "passages": len(real) + pads,
                "padding": pads}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def open_generator(backend: str, args):
    """SmolLM2-135M on the embedded engine or on vLLM (a server of its own, compiled: the
    latency a user's worker sees after its start, which the first request pays)."""
    if backend == "local":
        from specrag.inference.local import LocalBackend, LocalModelConfig
        return LocalBackend(LocalModelConfig("smollm2-135m-instruct", num_threads=args.threads, dtype=args.dtype,
                                             prefix_cache_mb=args.prefix_cache_mb))
    from specrag.inference.vllm import VllmBackend, VllmConfig
    from specrag.inference.types import GenerateRequest
    kind, _, block = backend.partition(":")
    generator = VllmBackend("smollm2-135m-instruct", VllmConfig(kv_cache_gb=1, step_cache=kind == "vllm-step-cache",
                                                              block_size=int(block) if block else None),
                            dtype=args.dtype, threads=args.threads)
    generator.generate([GenerateRequest("Warm up.", max_new_tokens=4)])  # the server's start, not a request's
    return generator


def prefix_hits(states) -> dict:
    """The engine's prefix-cache hit rate over the requests' generation steps (cached prompt tokens
    over prompt tokens), apart for the steps that keep the step before's document and those with a
    new one: what a step recomputes when its document changes. None where the engine does not say."""
    steps = [r for s in states for r in getattr(s.trace.method, "step_reuse", [])]
    out = {}
    for key, new in (("hit_same_doc", False), ("hit_new_doc", True)):
        mine = [r for r in steps if r.new_document == new]
        known = mine and all(r.cached_tokens is not None for r in mine)
        out[key] = sum(r.cached_tokens for r in mine) / max(1, sum(r.prompt_tokens for r in mine)) if known else None
    out["new_doc_steps"] = sum(r.new_document for r in steps)
    return out


def serve(services, method, queries: list[dict], label: str, cache: Path | None = None) -> tuple[list[float], list]:
    """One request at a time on a fresh engine (the paper's serving latency)."""
    from specrag.inference import Engine
    from workloads import serve_one_by_one
    engine = Engine(services)
    try:
        return serve_one_by_one(engine, method, queries, cache)
    except SystemExit as e:
        raise SystemExit(f"{label}: {e}") from None
    finally:
        engine.close()


def knnlm_rows(args, work: Path, data: Path, queries: list[dict]) -> list[dict]:
    """KNN-LM vs RaLMSpec (+S) for KNN-LM over a datastore of the pooled corpus, per k."""
    from specrag.inference import Services
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.methods import create_method
    from specrag.pipelines.build_datastore import run_build_datastore
    from specrag.retrieval.datastore import Datastore
    from workloads import cache_file
    ds = work / f"datastore-{args.knnlm_entries}-{args.dtype}"
    if not (ds / "manifest.json").exists():
        # enough passages (by id, the datastore's order) for the entries: ~100 contexts each
        import pyarrow.parquet as pq
        pooled = pq.read_table(data / "pooled_corpus.parquet").sort_by("id")
        subset = work / f"datastore-corpus-{args.knnlm_entries}.parquet"
        pq.write_table(pooled.slice(0, min(pooled.num_rows, args.knnlm_entries // 95 + 1)), subset)
        run_build_datastore(str(subset), str(ds), max_entries=args.knnlm_entries,
                            dtype=args.dtype, num_threads=args.threads,
                            beam_args=("--runner=FnApiRunner", "--direct_num_workers=2",
                                       "--direct_running_mode=multi_processing"))
    stores = {"flat": ds, "hnsw": ds}
    if args.knnlm_extend_to:
        from specrag.importers.distractors import extend_datastore
        stores["flat"] = work / f"datastore-{args.knnlm_entries}-{args.dtype}-extended-{args.knnlm_extend_to}"
        if not (stores["flat"] / "manifest.json").exists():
            extend_datastore(ds, stores["flat"], args.knnlm_extend_to)
    lm = LocalBackend(LocalModelConfig("smollm2-135m-instruct", num_threads=args.threads, dtype=args.dtype,
                                       prefix_cache_mb=args.prefix_cache_mb))
    rows = []
    for kind, folder in stores.items():
        store = Datastore(folder, kind)
        for k in [int(x) for x in args.knnlm_k.split(",")]:
            base = None
            for label, name, extra in KNNLM_VARIANTS:
                lm.clear_prefix_cache()
                method = create_method(name, k=k, max_new_tokens=args.knnlm_tokens, **extra)
                lat, states = serve(Services(models={"generator": lm}, resources={"datastore": store}), method,
                                    queries[: args.knnlm_questions], f"knnlm {kind} k={k} {label}",
                                    cache_file(work / "measured-knnlm" / f"{folder.name}-{kind}", args.dataset, method,
                                               f"{args.dtype}-pc{args.prefix_cache_mb}", args.threads))
                outs = {s.id: s.trace.method.output_ids for s in states}
                base = base or outs
                rows.append({"datastore": kind, "entries": len(store), "k": k, "method": label,
                             "mean_latency_s": statistics.mean(lat),
                             "generation_s": statistics.mean(s.trace.timings["generation_s"] for s in states),
                             "retrieval_s": statistics.mean(s.trace.timings["retrieval_s"] for s in states),
                             "accepted": sum(s.trace.counts["speculation_accepted"] for s in states),
                             "rollbacks": sum(s.trace.counts["rollbacks"] for s in states),
                             "identical": f"{sum(outs[i] == base[i] for i in base)}/{len(base)}"})
                print(f"  knnlm {kind} k={k} {label}: {rows[-1]['mean_latency_s']:.2f}s", file=sys.stderr, flush=True)
            seq = rows[-len(KNNLM_VARIANTS)]["mean_latency_s"]
            for r in rows[-len(KNNLM_VARIANTS):]:
                r["speedup"] = seq / r["mean_latency_s"]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--edr-vectors", type=int, default=2_000_000)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--doc-tokens", type=int, default=128)
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--backends", default="local",
                    help="comma-separated, in one sitting: local (the embedded engine), vllm (`make install-vllm`), "
                         "vllm-step-cache (vLLM, a RaLM step reusing its prompt's cached blocks: --vllm-step-cache); "
                         "a vLLM one as NAME:BLOCK for KV blocks of BLOCK tokens (--vllm-block-size; default vLLM's, "
                         "128 on a CPU). The claim line speaks for the last vLLM one with the step cache (else vllm's)")
    ap.add_argument("--baseline-again", action="store_true",
                    help="serve RaLMSeq again after the variants (the server warm, caches as the variants left "
                         "them): speed-ups are over the mean of both RaLMSeq runs, the table shows each")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefix-cache-mb", type=int, default=0,
                    help="prefix KV reuse of the generator (0: off); emptied before each variant")
    ap.add_argument("--retrievers", default="edr,adr,sr",
                    help="edr, adr, sr, lucene; cheap: bm25s over the pooled corpus alone (RaLMSeq and +F: "
                         "cheap_bm25_ratio) when --scale-index puts sr on the large corpus")
    ap.add_argument("--search-reps", type=int, default=3, help="calls per batch size in the search-cost table; "
                                                               "0: no table")
    ap.add_argument("--scale-index", default=None,
                    help="indexes of benchmarks/scale_corpus.py (pooled corpus + generated distractors), comma-"
                         "separated: EDR (dense), ADR (hnsw), SR (bm25) and lucene search the first that has their "
                         "kind instead of the pooled corpus")
    ap.add_argument("--variants", default="", help="comma-separated labels of VARIANTS to run (RaLMSeq always "
                                                   "runs first); default all")
    ap.add_argument("--dataset", default="nq", help="nq (short answers) or asqa (long-form: outputs run long)")
    ap.add_argument("--knnlm-k", default="1,16,256", help="empty: skip the KNN-LM part")
    ap.add_argument("--knnlm-entries", type=int, default=1_000_000, help="entries of the real datastore (Beam job)")
    ap.add_argument("--knnlm-extend-to", type=int, default=0,
                    help="exact (flat) KNN-LM over the real datastore extended with generated entries to this "
                         "many (importers/distractors.py extend_datastore); HNSW stays over the real one")
    ap.add_argument("--knnlm-questions", type=int, default=10)
    ap.add_argument("--knnlm-tokens", type=int, default=32)
    ap.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "ralmspec.md"))
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch
    torch.set_num_threads(args.threads)
    from specrag.importers import import_datasets
    from specrag.inference import Services
    from specrag.evaluation.compare_report import retrieval_ceiling
    from specrag.inference.local import LocalBackend, LocalModelConfig
    from specrag.methods import create_method
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval import open_retriever
    from specrag.schemas import validate_query
    from search_cost import BATCHES, time_batches
    from workloads import SHARED_SETS, cache_file, machine_line, markdown_table, publish

    work = Path(os.environ.get("SPECRAG_BENCH_DIR", "/tmp/specrag-ralmspec-bench"))
    data = work / "data"
    if not (data / "pooled_corpus.parquet").exists():
        import_datasets(Path(args.data_dir), SHARED_SETS, data, pool=True)
    kinds = args.retrievers.split(",")
    wanted = set(args.variants.split(",")) - {""}
    if wanted - {label for label, _, _ in VARIANTS}:
        raise SystemExit(f"--variants: some of {[label for label, _, _ in VARIANTS]}")
    variants = [v for v in VARIANTS if not wanted or v[0] in wanted | {"RaLMSeq"}]
    def index_of(name: str, index_kinds: list[str]) -> Path:
        folder = work / f"index-{name}"
        if not (folder / "manifest.json").exists():
            run_build_index(str(data / "pooled_corpus.parquet"), str(folder), index_kinds)
        return folder
    embedder = LocalBackend(LocalModelConfig("all-minilm-l6-v2", num_threads=args.threads))
    retrievers, served_by = {}, {}  # served_by: kind -> (scale index, its passages)
    scales = [Path(p) for p in args.scale_index.split(",")] if args.scale_index else []
    scale = scales[0] if scales else None
    manifests = [(p, json.loads((p / "manifest.json").read_text())) for p in scales]
    for kind, index_kind in (("edr", "dense"), ("adr", "hnsw"), ("sr", "bm25"), ("lucene", "lucene")):
        if kind in kinds and scales:
            found = next(((p, m["passages"]) for p, m in manifests if index_kind in m["kinds"]), None)
            if found is None:
                raise SystemExit(f"{kind}: no {index_kind!r} index in --scale-index {args.scale_index}")
            retrievers[kind], served_by[kind] = open_retriever(found[0], index_kind, embedder.embed), found
    if "edr" in kinds and scale is None:
        padded = work / f"edr-{args.edr_vectors}"
        if not (padded / "manifest.json").exists():
            padded_flat_index(index_of("dense", ["dense", "hnsw"]), padded, args.edr_vectors)
        retrievers["edr"] = open_retriever(padded, "dense", embedder.embed)
    if "adr" in kinds and scale is None:
        retrievers["adr"] = open_retriever(index_of("dense", ["dense", "hnsw"]), "hnsw", embedder.embed)
    if "sr" in kinds and scale is None:
        retrievers["sr"] = open_retriever(index_of("sparse", ["bm25"]), "bm25")
    if "lucene" in kinds and scale is None:  # the second sparse retriever (pyserini), same corpus
        retrievers["lucene"] = open_retriever(index_of("lucene", ["lucene"]), "lucene")
    if "cheap" in kinds:  # retrieval at ~1 ms: where speculation has nothing to save (the full suite's setting)
        retrievers["cheap"] = open_retriever(index_of("sparse", ["bm25"]), "bm25")
    queries = [validate_query(r) for r in
               pq.read_table(data / args.dataset / "queries.parquet").to_pylist()][:args.questions]
    backends = args.backends.split(",")
    if {b.partition(":")[0] for b in backends} - {"local", "vllm", "vllm-step-cache"} or "local:" in args.backends \
            or not all(b.partition(":")[2].isdigit() for b in backends if ":" in b):
        raise SystemExit("--backends: some of local, vllm[:BLOCK], vllm-step-cache[:BLOCK]")
    settings = dict(stride=args.stride, max_new_tokens=args.max_new_tokens, doc_max_tokens=args.doc_tokens)

    cost_rows = []
    for kind, retriever in retrievers.items() if args.search_reps else ():
        costs = time_batches(lambda batch: retriever.search(batch, 20), [q["question"] for q in queries],
                             args.search_reps)
        cost_rows.append({"retriever": kind, "single_ms": 1000 * costs[1],
                          **{f"x{s}": costs[s] / costs[1] for s in BATCHES[1:]}})
        print(f"  search cost {kind}: {cost_rows[-1]}", file=sys.stderr, flush=True)
    # measured requests are kept per (index, variant): an interrupted run resumes where it stopped
    def measured(kind: str) -> Path:
        folder, passages = served_by.get(kind, (None, 0))
        return work / "measured-ralmspec" / (f"{folder.name}-{passages}" if folder else f"pooled-edr{args.edr_vectors}")
    rows, identical = [], True
    for backend in backends:
        generator = open_generator(backend, args)
        # vLLM's own prefix cache holds what vLLM holds; a RaLM step skips it (a batch-invariant row)
        model_key = f"{args.dtype}-pc{args.prefix_cache_mb}" + ("" if backend == "local" else
                                                                 f"-{backend.replace(':', '-b')}")
        for kind, retriever in retrievers.items():
            t = time.perf_counter()  # one exact search should cost about one generation step
            retriever.search([queries[0]["question"]], 20)
            search_s = time.perf_counter() - t
            baseline = None
            for label, name, extra in variants + ([AGAIN] if args.baseline_again else []):
                if kind == "cheap" and label not in ("RaLMSeq", "RaLMSpec+F"):
                    continue
                # each variant starts as a fresh worker would: a warm vLLM server held RaLMSeq's prompts
                # (question and document) for every later variant (`hit_new_doc` showed it)
                generator.clear_prefix_cache()
                method = create_method(name, **settings, **extra)
                latencies, states = serve(Services(models={"generator": generator}, retriever=retriever),
                                          method, queries, f"{kind} {label}",
                                          cache_file(measured(kind) / kind, args.dataset, method,
                                                     model_key + ("-again" if label == AGAIN[0] else ""), args.threads))
                outputs = {s.id: s.trace.method.output_ids for s in states}
                if baseline is None:
                    baseline = outputs
                same = sum(outputs[k] == baseline[k] for k in baseline)
                identical &= same == len(baseline)
                t = lambda key: statistics.mean(s.trace.timings[key] for s in states)  # noqa: E731
                c = lambda key: sum(s.trace.counts[key] for s in states)  # noqa: E731
                steps = [getattr(s.trace.method, "speculation_steps", 0) for s in states]
                passages = served_by[kind][1] if kind in served_by else len(getattr(retriever, "store", ()))
                rows.append({"retriever": kind, "backend": backend, "passages": passages,
                             "method": label, "mean_latency_s": statistics.mean(latencies),
                             "generation_s": t("generation_s"), "retrieval_s": t("retrieval_s"),
                             "index_searches": c("retrieval_calls"), "speculation_steps": sum(steps),
                             "accepted": c("speculation_accepted"), "rollbacks": c("rollbacks"),
                             "pad_docs": sum(d.startswith(("~pad-", "distractor-")) for s in states for d in s.trace.method.step_docs),
                             "identical": f"{same}/{len(baseline)}", "single_search_s": search_s, **prefix_hits(states)})
                print(f"  {backend} {kind} {label}: {rows[-1]['mean_latency_s']:.2f}s per request", file=sys.stderr,
                      flush=True)
            seqs = [r for r in rows if r["retriever"] == kind and r["backend"] == backend
                    and r["method"] in ("RaLMSeq", AGAIN[0])]
            seq = {key: statistics.mean(r[key] for r in seqs) for key in ("mean_latency_s", "retrieval_s")}
            for r in rows:
                if r["retriever"] == kind and r["backend"] == backend:
                    r["speedup"] = seq["mean_latency_s"] / r["mean_latency_s"]
                    # a variant gives RaLMSeq's tokens: it can save only RaLMSeq's retrieval time
                    r.update(retrieval_ceiling(r["identical"].split("/")[0] == r["identical"].split("/")[1],
                                               seq["retrieval_s"], seq["mean_latency_s"], r["mean_latency_s"]))
        if backend != "local":
            generator.server.stop()  # its server goes: the next backend gets the cores
    knn_rows = knnlm_rows(args, work, data, queries) if args.knnlm_k else []
    cols = ["retriever", "backend", "passages", "method", "mean_latency_s", "generation_s", "retrieval_s", "speedup",
            "retrieval_share", "ceiling", "share_of_gain", "index_searches", "speculation_steps", "accepted",
            "rollbacks", "pad_docs", "identical", "single_search_s", "hit_same_doc", "hit_new_doc", "new_doc_steps"]
    # the claim line's backend (the best of vLLM's): the table has every one
    claimed = next((b for kind in ("vllm-step-cache", "vllm") for b in reversed(backends) if b.partition(":")[0] == kind),
                   backends[0])

    def best(kind):
        return max((r for r in rows if r["retriever"] == kind and r["backend"] == claimed
                    and r["method"] in ("RaLMSpec+PSA", "RaLMSpec+PSAF")), key=lambda r: r["speedup"], default=None)

    def speedup(kind):
        return f"{best(kind)['speedup']:.2f}" if best(kind) else "na"

    def ceiling(kind, key):
        value = (best(kind) or {}).get(key)
        return "na" if value is None else f"{value:.2f}"
    setup = (f"{machine_line(args.threads)}, generator dtype {args.dtype}, prefix KV reuse "
             f"{f'{args.prefix_cache_mb} MiB' if args.prefix_cache_mb else 'off'}; {len(queries)} {args.dataset} questions served one "
             f"at a time; stride {args.stride} tokens, documents cut to {args.doc_tokens} tokens, up to "
             f"{args.max_new_tokens} new tokens; " + (
                 "EDR = flat, ADR = HNSW, SR = bm25s (lucene: Lucene BM25) over the pooled corpus + generated "
                 "distractors (passages: the table; " + ", ".join(f"{k}: {p}" for k, (p, _) in served_by.items()) + ")"
                 if scale else
                 f"EDR = flat over {args.edr_vectors:,} vectors (pooled corpus + random unit padding), ADR = HNSW "
                 f"and SR = bm25s over the pooled corpus (14,947 passages)") + "; pad_docs: accepted steps whose "
             "document was padding or a distractor")
    setup += ("; hit_same_doc / hit_new_doc: the engine's prefix-cache hits (cached prompt tokens over prompt "
              "tokens) on steps that keep the step before's document / take a new one (blank: the engine does not "
              "say); vLLM's KV blocks: 128 tokens unless the backend says :BLOCK")
    if "cheap" in retrievers:
        setup += "; cheap = bm25s over the pooled corpus alone"
    if args.knnlm_k:
        setup += (f"; KNN-LM: {args.knnlm_questions} questions, {args.knnlm_tokens} tokens, a real datastore of "
                  f"{args.knnlm_entries:,} entries (SmolLM2 states over the pooled corpus, Beam job)")
    if args.knnlm_k and args.knnlm_extend_to:
        setup += f" extended with generated entries to {args.knnlm_extend_to:,} for the exact (flat) search"
    setup += "."
    identical &= all(r["identical"].split("/")[0] == r["identical"].split("/")[1] for r in knn_rows)

    def knn_best(kind):
        best = [r["speedup"] for r in knn_rows if r["datastore"] == kind and r["method"] != "KNN-LM"]
        return f"{max(best):.2f}" if best else "na"
    cheap_kind = "cheap" if "cheap" in retrievers else "sr" if scale is None else None
    cheap = next((f"{r['speedup']:.2f}" for r in rows if r["retriever"] == cheap_kind and r["method"] == "RaLMSpec+F"),
                 "na")
    last = (f"edr_speedup={speedup('edr')} adr_speedup={speedup('adr')} sr_speedup={speedup('sr')} "
            f"knnlm_edr_speedup={knn_best('flat')} knnlm_adr_speedup={knn_best('hnsw')} cheap_bm25_ratio={cheap} "
            f"identical={'true' if identical else 'false'} backend={claimed} edr_ceiling={ceiling('edr', 'ceiling')} "
            f"edr_share_of_ceiling={ceiling('edr', 'share_of_gain')}")
    report = ["", *markdown_table(rows, cols)]
    if cost_rows:
        report += ["", "Search cost (median of --search-reps calls; x<s>: one search of s questions, top-20, in single "
                   "searches — embedding included for the dense kinds; the paper: about 1 below 10 queries for exact "
                   "retrieval on its GPU):", "",
                   *markdown_table(cost_rows, ["retriever", "single_ms", *(f"x{s}" for s in BATCHES[1:])])]
    if knn_rows:
        report += ["", "KNN-LM (token-level), same questions, one request at a time:", "",
                   *markdown_table(knn_rows, ["datastore", "entries", "k", "method", "mean_latency_s", "generation_s",
                                              "retrieval_s", "speedup", "accepted", "rollbacks", "identical"])]
    publish(args.results, "RaLMSpec benchmark", setup, "\n".join(report), last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
