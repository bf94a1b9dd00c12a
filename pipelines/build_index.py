"""`specrag build-index`: corpus Parquet → validated passages (+ embedding shards) → index folder.

The Beam job validates and deduplicates passages (bad rows to dead letters) and, for dense
indexes, embeds them in batches on the workers, writing (id, vector) shards. The indexes
themselves (bm25s, FAISS) are then built from those files in this process.
"""
from __future__ import annotations

import glob
import time
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.parquetio import WriteToParquet
from apache_beam.options.pipeline_options import PipelineOptions

from specrag.pipelines.manifest import write_manifest
from specrag.retrieval.base import passage_text
from specrag.retrieval.index import DENSE_KINDS, KINDS, finish_index
from specrag.schemas.tables import DEAD_LETTERS, PASSAGES
from specrag.schemas.validation import validate_passage
from specrag.transforms.parquet_io import ReadParquetRows, dataset_fingerprint, expand_inputs
from specrag.transforms.runtime import load_backend
from specrag.transforms.validate import ValidateRows

EMBEDDINGS = pa.schema([pa.field("id", pa.string()), pa.field("vector", pa.list_(pa.float32()))])


class EmbedPassages(beam.DoFn):
    """A batch of passages → (id, vector) rows; the encoder loads once per worker."""

    def __init__(self, model: str, num_threads: int):
        self.model, self.num_threads = model, num_threads

    def setup(self):
        self.encoder = load_backend("local", self.model, self.num_threads)

    def process(self, batch: list[dict]):
        vectors = self.encoder.embed([passage_text(p["title"], p["text"]) for p in batch])
        for p, v in zip(batch, vectors):
            yield {"id": p["id"], "vector": v.tolist()}


def run_build_index(corpus: str, index_dir: str, kinds: list[str], *, embedder: str = "all-minilm-l6-v2",
                    num_threads: int = 1, beam_args: tuple[str, ...] = ("--runner=FnApiRunner",),
                    dense_params: dict[str, dict] | None = None) -> dict:
    bad = set(kinds) - set(KINDS)
    if bad or not kinds:
        raise ValueError(f"--kinds must name some of {', '.join(KINDS)}; got {kinds}")
    files = expand_inputs(corpus)
    out = Path(index_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(out / "shards" / "*")) + glob.glob(str(out / "embeddings" / "*")):
        Path(stale).unlink()
    started = time.time()
    with beam.Pipeline(options=PipelineOptions(list(beam_args))) as p:
        rows = p | "ReadCorpus" >> ReadParquetRows(corpus)
        valid, dead = rows | "ValidatePassages" >> ValidateRows(validate_passage)
        valid | "WritePassages" >> WriteToParquet(str(out / "shards" / "passages"), PASSAGES,
                                                  file_name_suffix=".parquet")
        dead | "WriteDeadLetters" >> WriteToParquet(str(out / "dead_letters"), DEAD_LETTERS,
                                                    file_name_suffix=".parquet")
        if any(k in DENSE_KINDS for k in kinds):
            (valid
             | "BatchPassages" >> beam.BatchElements(min_batch_size=32, max_batch_size=256)
             | "Embed" >> beam.ParDo(EmbedPassages(embedder, num_threads))
             | "WriteEmbeddings" >> WriteToParquet(str(out / "embeddings" / "part"), EMBEDDINGS,
                                                   file_name_suffix=".parquet"))
    # the document store: one file, rows sorted by id so every build orders alike
    table = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(str(out / "shards" / "*.parquet")))])
    table = table.sort_by("id")
    pq.write_table(table.cast(PASSAGES), out / "passages.parquet")
    dead_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in glob.glob(str(out / "dead_letters*.parquet")))
    dense = any(k in DENSE_KINDS for k in kinds)
    index_manifest = finish_index(out, kinds, embedder if dense else None,
                                  {"corpus": dataset_fingerprint(files), "dead_letters": dead_rows},
                                  dense_params)
    return write_manifest(out, {"job": "build-index", "index": index_manifest, "beam_args": list(beam_args),
                                "wall_s": round(time.time() - started, 3)}, name="build_manifest.json")
