"""Generated distractors (importers/distractors.py) and build-index with precomputed vectors."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.importers.distractors import (DistractorConfig, TermModel, VectorModel, answer_words, words,
                                           write_distractors)

from conftest import BEAM_ARGS


def _demo(demo_tables):
    queries, corpus = (pq.read_table(t).to_pylist() for t in demo_tables[:2])
    return queries, corpus


def test_distractors_hold_no_answer_word_and_no_real_id(demo_tables, tmp_path):
    queries, corpus = _demo(demo_tables)
    banned = answer_words(a for q in queries for a in q["answers"])
    terms = TermModel.fit([p["title"] for p in corpus], [p["text"] for p in corpus], banned)
    config = DistractorConfig(passages=1000, shard_rows=300, seed=7)
    rng = np.random.default_rng(0)
    real = rng.standard_normal((50, 16))
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    summary = write_distractors(config, terms, tmp_path / "a", {p["id"] for p in corpus}, VectorModel.fit(real))
    assert summary["shards"] == 4 and summary["written_now"] == 1000
    rows = pq.read_table(tmp_path / "a" / "passages").to_pylist()
    assert len(rows) == 1000 and len({r["id"] for r in rows}) == 1000
    assert not {r["id"] for r in rows} & {p["id"] for p in corpus}
    used = {w for r in rows for w in words(r["title"] + " " + r["text"])}
    assert used and not used & banned
    assert used <= {w for p in corpus for w in words(p["title"] + " " + p["text"])}
    vectors = pq.read_table(tmp_path / "a" / "vectors")
    assert vectors.column("id").to_pylist() == [r["id"] for r in rows]
    matrix = np.array(vectors.column("vector").to_pylist())
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1, atol=1e-5)  # unit, as the real ones
    # seeded per shard: a second generation is byte-identical; a finished shard is kept on resume
    write_distractors(config, terms, tmp_path / "b", set(), VectorModel.fit(real))
    for part in ("passages", "vectors"):
        for f in sorted((tmp_path / "a" / part).iterdir()):
            assert f.read_bytes() == (tmp_path / "b" / part / f.name).read_bytes()
    assert write_distractors(config, terms, tmp_path / "b", set(), VectorModel.fit(real))["written_now"] == 0
    with pytest.raises(ValueError, match="meet real passage ids"):
        write_distractors(DistractorConfig(passages=3, id_prefix="demo-00"), terms, tmp_path / "c",
                          {p["id"] for p in corpus})


def test_build_index_takes_precomputed_vectors(demo_tables, demo_index, tmp_path):
    """The job embeds only passages without a precomputed vector; precomputed rows land as
    given, the others as a plain build embeds them; a vector whose passage is a dead letter is
    counted, not used."""
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval.dense import VECTORS
    queries, corpus = _demo(demo_tables)
    terms = TermModel.fit([p["title"] for p in corpus], [p["text"] for p in corpus],
                          answer_words(a for q in queries for a in q["answers"]))
    real = np.load(demo_index / VECTORS)
    gen = tmp_path / "gen"
    write_distractors(DistractorConfig(passages=200, shard_rows=120), terms, gen, {p["id"] for p in corpus},
                      VectorModel.fit(real))
    pq.write_table(pa.table({"id": ["bad-1"], "title": ["t"], "text": [" "]}), gen / "passages" / "bad.parquet")
    pq.write_table(pa.table({"id": ["bad-1"], "vector": pa.array([real[0].tolist()], pa.list_(pa.float32()))}),
                   gen / "vectors" / "bad.parquet")
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    pq.write_table(pq.read_table(demo_tables[1]), corpus_dir / "real.parquet")
    for f in (gen / "passages").iterdir():
        (corpus_dir / f.name).write_bytes(f.read_bytes())
    index = tmp_path / "index"
    manifest = run_build_index(str(corpus_dir / "*.parquet"), str(index), ["dense"], beam_args=BEAM_ARGS,
                               embeddings=str(gen / "vectors" / "*.parquet"))
    built = json.loads((index / "manifest.json").read_text())
    assert built["passages"] == len(corpus) + 200 and built["dead_letters"] == 1
    assert built["precomputed_vectors"] == {"files": 3, "unused": 1}
    ids = pq.read_table(index / "passages.parquet").column("id").to_pylist()
    matrix = np.load(index / VECTORS)
    given = pq.read_table(gen / "vectors").to_pylist()
    given = {r["id"]: r["vector"] for r in given if r["id"] != "bad-1"}
    np.testing.assert_array_equal(matrix[[ids.index(i) for i in sorted(given)]],
                                  np.array([given[i] for i in sorted(given)], dtype=np.float32))
    plain_ids = pq.read_table(demo_index / "passages.parquet").column("id").to_pylist()
    np.testing.assert_allclose(matrix[[ids.index(i) for i in plain_ids]], real, atol=1e-5)
    assert manifest["index"]["precomputed_vectors"]["unused"] == 1
    with pytest.raises(ValueError, match="needs a dense kind"):
        run_build_index(str(corpus_dir / "*.parquet"), str(tmp_path / "i2"), ["bm25"], beam_args=BEAM_ARGS,
                        embeddings=str(gen / "vectors" / "*.parquet"))

