"""Generated distractor passages: retrieval at the papers' scale from a real corpus's statistics.

RaLMSpec's gains depend on what a search costs; the paper retrieves from 21M Wikipedia passages,
the shared sets pool 15k. A scale benchmark corpus is the real pooled corpus plus N generated
passages that change the cost of every search but never its right answers:

- **Text**: words drawn independently from the real corpus's unigram distribution (lower-cased
  word tokens), lengths drawn from the real passages' word counts, titles from the real titles'
  word distribution and lengths. Every word of every answer of the benchmark's questions
  (normalised as the metrics normalise) is left out of the vocabulary, so no distractor holds an
  answer as a word sequence; ids live in their own namespace and must not meet a real id, so no
  distractor is ever gold.
- **Vectors** (dense kinds): a Gaussian with the real embeddings' mean and covariance, scaled to
  unit length when the real ones are, written as (id, vector) Parquet that `build-index
  --embeddings` takes instead of embedding the passages (5M embeddings take hours here).
- **KNN-LM datastore entries** (``extend_datastore``): keys from a Gaussian fit of the real
  datastore's keys, next tokens drawn from its values, appended after the real entries (so a
  real entry's successors stay real); the copy is a flat, scan-only datastore (no FAISS file: a
  5M x 576 fp32 FAISS copy of the keys would not fit beside them in 24 GB).

Everything is seeded per shard (the same shard has the same rows whatever the shard count
written before it), and written shard by shard, so 5M passages never sit in memory at once.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specrag.evaluation.metrics import normalize
from specrag.schemas.tables import PASSAGES

WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?")
EMBEDDINGS = pa.schema([pa.field("id", pa.string()), pa.field("vector", pa.list_(pa.float32()))])


@dataclass(frozen=True)
class DistractorConfig:
    passages: int
    seed: int = 0
    id_prefix: str = "distractor-"
    shard_rows: int = 250_000

    def validate(self) -> None:
        if self.passages < 1:
            raise ValueError(f"passages must be >= 1, got {self.passages}")
        if self.shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {self.shard_rows}")
        if not self.id_prefix:
            raise ValueError("id_prefix must not be empty: distractor ids need their own namespace")

    def shard_ids(self, shard: int) -> list[str]:
        start = shard * self.shard_rows
        width = len(str(self.passages - 1))
        return [f"{self.id_prefix}{i:0{width}d}" for i in range(start, min(start + self.shard_rows, self.passages))]

    @property
    def shards(self) -> int:
        return -(-self.passages // self.shard_rows)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def answer_words(answers: Iterable[str]) -> set[str]:
    """The words no distractor may hold: every word of every answer, as the metrics normalise."""
    return {w for a in answers for w in normalize(a).split()}


@dataclass
class TermModel:
    """Unigram statistics of a real corpus: vocabulary, probabilities, length distributions."""

    vocab: np.ndarray  # object array of words
    probs: np.ndarray
    lengths: np.ndarray  # words per passage, one entry per real passage
    title_vocab: np.ndarray
    title_probs: np.ndarray
    title_lengths: np.ndarray

    @classmethod
    def fit(cls, titles: Sequence[str], texts: Sequence[str], banned: set[str]) -> "TermModel":
        body, head = Counter(), Counter()
        lengths, title_lengths = [], []
        for title, text in zip(titles, texts):
            ws, ts = words(text), words(title or "")
            body.update(ws)
            head.update(ts)
            lengths.append(len(ws))
            title_lengths.append(len(ts))

        def dist(counts: Counter):
            kept = sorted((w, c) for w, c in counts.items() if w not in banned and normalize(w) not in banned)
            if not kept:
                raise ValueError("no words left once the answers' words are removed")
            vocab = np.array([w for w, _ in kept], dtype=object)
            freq = np.array([c for _, c in kept], dtype=np.float64)
            return vocab, freq / freq.sum()

        vocab, probs = dist(body)
        title_vocab, title_probs = dist(head) if head else (vocab, probs)
        return cls(vocab, probs, np.maximum(np.array(lengths), 1), title_vocab, title_probs,
                   np.array(title_lengths))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
        """n (title, text) pairs."""
        return self._texts(rng, n, self.title_vocab, self.title_probs, self.title_lengths), \
            self._texts(rng, n, self.vocab, self.probs, self.lengths)

    @staticmethod
    def _texts(rng, n, vocab, probs, lengths) -> list[str]:
        counts = rng.choice(lengths, size=n)
        flat = vocab[rng.choice(len(vocab), size=int(counts.sum()), p=probs)]
        ends = np.cumsum(counts)
        return [" ".join(flat[e - c:e]) for c, e in zip(counts.tolist(), ends.tolist())]


@dataclass
class VectorModel:
    """A Gaussian fit of real embeddings (or KNN-LM keys); unit length when the real ones are."""

    mean: np.ndarray
    factor: np.ndarray  # Cholesky factor of the covariance
    unit: bool

    @classmethod
    def fit(cls, vectors: np.ndarray, max_rows: int = 200_000, seed: int = 0) -> "VectorModel":
        vectors = np.asarray(vectors, dtype=np.float64)
        if len(vectors) > max_rows:
            vectors = vectors[np.sort(np.random.default_rng(seed).choice(len(vectors), max_rows, replace=False))]
        if len(vectors) < 2:
            raise ValueError("fitting a vector distribution needs at least 2 real vectors")
        mean = vectors.mean(0)
        cov = np.cov(vectors, rowvar=False) + 1e-6 * np.eye(vectors.shape[1])  # full rank for Cholesky
        norms = np.linalg.norm(vectors, axis=1)
        return cls(mean, np.linalg.cholesky(cov), bool(np.all(np.abs(norms - 1) < 1e-3)))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.standard_normal((n, len(self.mean))) @ self.factor.T + self.mean
        if self.unit:
            x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x.astype(np.float32)


def vector_table(ids: list[str], vectors: np.ndarray) -> pa.Table:
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
    offsets = pa.array(np.arange(0, vectors.size + 1, vectors.shape[1], dtype=np.int32))
    return pa.table([pa.array(ids, pa.string()), pa.ListArray.from_arrays(offsets, flat)], schema=EMBEDDINGS)


def write_distractors(config: DistractorConfig, terms: TermModel, out: Path, real_ids: set[str],
                      vectors: VectorModel | None = None) -> dict:
    """Shards ``out/passages/part-NNNNN.parquet`` (id, title, text) and, with ``vectors``,
    ``out/vectors/part-NNNNN.parquet`` (id, vector). Shards already written whole are kept (a
    stopped generation resumes)."""
    config.validate()
    out = Path(out)
    (out / "passages").mkdir(parents=True, exist_ok=True)
    if vectors is not None:
        (out / "vectors").mkdir(parents=True, exist_ok=True)
    written = 0
    for shard in range(config.shards):
        ids = config.shard_ids(shard)
        clash = real_ids.intersection(ids)
        if clash:
            raise ValueError(f"distractor ids meet real passage ids ({sorted(clash)[:3]}): choose another id_prefix")
        name = f"part-{shard:05d}.parquet"
        targets = [out / "passages" / name] + ([out / "vectors" / name] if vectors is not None else [])
        if all(t.exists() for t in targets):
            continue
        rng = np.random.default_rng([config.seed, shard])
        titles, texts = terms.sample(rng, len(ids))
        table = pa.table([pa.array(ids), pa.array(titles), pa.array(texts)], schema=PASSAGES)
        _write_atomic(table, out / "passages" / name)
        if vectors is not None:
            _write_atomic(vector_table(ids, vectors.sample(rng, len(ids))), out / "vectors" / name)
        written += len(ids)
    return {"passages": config.passages, "shards": config.shards, "written_now": written, "seed": config.seed,
            "vocabulary": int(len(terms.vocab)), "vectors": vectors is not None}


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def extend_datastore(source: Path, out: Path, entries: int, seed: int = 0, chunk: int = 250_000) -> dict:
    """A flat, scan-only datastore of ``entries`` rows: the real datastore's, then generated ones.
    Keys are written chunk by chunk into a memory-mapped ``keys.npy``."""
    import json
    source, out = Path(source), Path(out)
    if out.resolve() == source.resolve():
        raise ValueError("extend_datastore writes a new datastore: out must differ from source")
    manifest = json.loads((source / "manifest.json").read_text())
    real_keys = np.load(source / "keys.npy", mmap_mode="r")
    real_values = np.load(source / "values.npy")
    if entries < len(real_keys):
        raise ValueError(f"entries ({entries}) must be at least the real datastore's {len(real_keys)}")
    model = VectorModel.fit(real_keys, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    keys = np.lib.format.open_memmap(out / "keys.npy.tmp", mode="w+", dtype=np.float32,
                                     shape=(entries, real_keys.shape[1]))
    values = np.empty(entries, dtype=np.int64)
    for start in range(0, len(real_keys), chunk):
        end = min(start + chunk, len(real_keys))
        keys[start:end] = real_keys[start:end]
    values[:len(real_keys)] = real_values
    for i, start in enumerate(range(len(real_keys), entries, chunk)):
        n = min(chunk, entries - start)
        rng = np.random.default_rng([seed, i])
        keys[start:start + n] = model.sample(rng, n)
        values[start:start + n] = rng.choice(real_values, size=n)
    keys.flush()
    del keys
    (out / "keys.npy.tmp").replace(out / "keys.npy")
    np.save(out / "values.npy", values)
    for f in out.glob("*.faiss"):  # an earlier copy's: FAISS files would not index the generated rows
        f.unlink()
    extended = {**manifest, "entries": int(entries), "kinds": {"flat": {"faiss": False}},
                "generated": {"from": str(source), "real_entries": int(len(real_keys)),
                              "generated_entries": int(entries - len(real_keys)), "seed": seed}}
    (out / "manifest.json").write_text(json.dumps(extended, indent=2, sort_keys=True))
    return extended
