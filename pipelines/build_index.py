"""`specrag build-index`: corpus Parquet → validated passages (+ embedding shards) → index folder.

The Beam job validates and deduplicates passages (bad rows to dead letters) and, for dense
indexes, embeds them with Beam's RunInference (the embedder behind a ModelHandler: loaded
once per worker, batched by BatchElements), writing (id, vector) shards; passages whose vector
comes precomputed (``embeddings``: (id, vector) Parquet of the same embedder, e.g. a generated
benchmark corpus's or one a user already has) are not embedded again. The indexes
themselves (bm25s, Lucene, FAISS) are then built from those files by one worker, in a last
stage of the job (``IndexFinish``), never on the launcher. Every
read and write goes through FileSystems: an index folder on gs:// or s3:// is built in a
local staging folder and published there, manifest last.
"""
from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.parquetio import WriteToParquet
from apache_beam.ml.inference.base import RunInference

from specrag.pipelines.manifest import write_manifest
from specrag.pipelines.options import dataflow_template, new_pipeline
from specrag.retrieval.base import passage_text
from specrag.retrieval.index import DENSE_KINDS, KINDS, finish_index
from specrag.schemas.tables import DEAD_LETTERS, PASSAGE_COLUMNS, PASSAGES
from specrag.schemas.validation import validate_passage
from specrag.jobio import files
from specrag.jobio.job_run import job_run
from specrag.jobio.run_folder import INDEX
from specrag.transforms.model_handler import BackendModelHandler, BlockHandler
from specrag.transforms.parquet_io import ReadParquetRows
from specrag.jobio.inputs import dataset_fingerprint, expand_inputs, expand_tables
from specrag.transforms.progress import CountProgress, count_rows, progress_dir, watch_progress
from specrag.transforms.validate import MARK_FIELD, ReadIds, ValidateRows

EMBEDDINGS = pa.schema([pa.field("id", pa.string()), pa.field("vector", pa.list_(pa.float32()))])


EMBED_BLOCK_ROWS = 256  # passages a block holds on average: the unit a worker embeds (in calls of 64)


def embedding_block(passage_id: str, blocks: int) -> int:
    """The block a passage is embedded in: a stable hash of its id (not Python's salted hash)."""
    import zlib
    return zlib.crc32(passage_id.encode("utf-8")) % blocks


def _vector_row(kv) -> dict:
    qid, prediction = kv
    return {"id": qid, "vector": prediction.inference.tolist()}


def _write_sorted_by_id(table: pa.Table, path: Path, rows_per_group: int = 1 << 20) -> None:
    """The passages sorted by id, written a row group at a time. A take over chunked strings
    concatenates their chunks into one array, whose 32-bit offsets overflow past 2 GB of text
    (5M passages): the take runs on 64-bit offsets, each row group is cast back."""
    import pyarrow.compute as pc
    table = table.cast(pa.schema([pa.field(f.name, pa.large_string() if pa.types.is_string(f.type) else f.type)
                                  for f in table.schema]))
    order = pc.sort_indices(table, sort_keys=[("id", "ascending")])
    with pq.ParquetWriter(path, PASSAGES) as writer:
        for start in range(0, max(len(order), 1), rows_per_group):
            writer.write_table(table.take(order[start:start + rows_per_group]).cast(PASSAGES))


class IndexFinish:
    """The index files (bm25s, Lucene, FAISS) from the job's shards, built in one place since each
    format is one structure: a one-element stage of the job that runs when every shard is written,
    so the work and its memory (5M passages: 2.5 minutes, 18 GB) are a worker's, not the
    launcher's. A remote index folder is built in a local staging folder and published, manifest
    last."""

    def __init__(self, index_dir: str, kinds: list[str], embedder: str | None, inputs: list[str],
                 precomputed: list[str], dense_params: dict | None):
        self.index_dir, self.kinds, self.embedder = index_dir, kinds, embedder
        self.inputs, self.precomputed, self.dense_params = inputs, precomputed, dense_params

    def __call__(self) -> None:
        index_dir, local = self.index_dir, files.is_local(self.index_dir)
        stage = Path(index_dir) if local else Path(tempfile.mkdtemp(prefix="specrag-index-"))
        try:
            # the document store: one file, rows sorted by id so every build orders alike
            shards = sorted(files.match_files(files.join(index_dir, "shards", "*.parquet")))
            _write_sorted_by_id(pa.concat_tables([files.read_parquet(f) for f in shards]),
                                stage / "passages.parquet")
            if self.embedder and not local:  # FAISS is built from local files
                for f in files.match_files(files.join(index_dir, "embeddings", "*.parquet")):
                    (stage / "embeddings").mkdir(exist_ok=True)
                    (stage / "embeddings" / f.rsplit("/", 1)[-1]).write_bytes(files.read_bytes(f))
            dead_rows = sum(files.open_parquet(f).metadata.num_rows
                            for f in files.match_files(files.join(index_dir, "dead_letters*.parquet")))
            extra = {"corpus": dataset_fingerprint(self.inputs), "dead_letters": dead_rows}
            if self.precomputed:
                extra["precomputed_fingerprint"] = dataset_fingerprint(self.precomputed)
            finish_index(stage, self.kinds, self.embedder, extra, self.dense_params, self.precomputed)
            if not local:
                files.publish(stage, index_dir, skip=("embeddings",))
            files.remove_tree(files.join(index_dir, "shards"))  # the job's passages, now in passages.parquet
        finally:
            if not local:
                shutil.rmtree(stage, ignore_errors=True)


def run_build_index(corpus: str, index_dir: str, kinds: list[str], *, embedder: str = "all-minilm-l6-v2",
                    num_threads: int = 1, beam_args: tuple[str, ...] = ("--runner=FnApiRunner",),
                    dense_params: dict[str, dict] | None = None, backend: str = "local",
                    backend_configs: tuple[Any, ...] = (), embeddings: str | None = None, overwrite: bool = False,
                    max_failure_fraction: float = 1.0) -> dict:
    """Build the index folder ``index_dir`` from the corpus; returns the build manifest.

    An existing index is replaced only with ``overwrite`` (and comes back if the rebuild fails);
    raises RunFailed, the index written, when more passages than ``max_failure_fraction`` ended
    as dead letters.

    Example usage::

        run_build_index("corpus.parquet", "index/", ["bm25", "dense"])
    """
    expand_tables(corpus, PASSAGE_COLUMNS, "corpus")  # before the folder is touched
    build = functools.partial(_build_index, corpus, str(index_dir), kinds, embedder=embedder, num_threads=num_threads,
                              beam_args=beam_args, dense_params=dense_params, backend=backend,
                              backend_configs=backend_configs, embeddings=embeddings)
    if dataflow_template(beam_args):  # the job's graph written for Dataflow: the folder is not touched
        return build()
    with job_run(str(index_dir), INDEX, overwrite=overwrite) as run:
        manifest = build()
        run.judge(run.folder.account(manifest["index"]["passages"]), max_failure_fraction)
    return manifest


def _index_graph(p, corpus: str, index_dir: str, kinds: list[str], *, embedder: str, dense: bool, handler,
                 precomputed: list[str], inputs: list[str], blocks: int, dense_params: dict[str, dict] | None) -> None:
    """The build-index job's graph: validated passages, their embeddings, the index finished once
    every shard is written."""
    progress = progress_dir(index_dir)
    covered = p | "PrecomputedIds" >> ReadIds(precomputed) if precomputed else None
    valid, dead = p | "ValidatePassages" >> ValidateRows(ReadParquetRows(corpus), validate_passage,
                                                         marked=covered)
    dead = dead | "ProgressDead" >> CountProgress(progress, "dead")
    if not dense:  # the passages are the work
        valid = valid | "ProgressPassages" >> CountProgress(progress, "done")
    if precomputed:  # two filters, not Partition + Flatten: the in-process runner executes a
        # multi-input Flatten itself, holding all its input (5M passages: 18.8 GB peak, 8.2 GB without)
        to_embed = valid | "ToEmbed" >> beam.Filter(lambda r: not r.get(MARK_FIELD))
        _ = (valid | "Precomputed" >> beam.Filter(lambda r: bool(r.get(MARK_FIELD)))
             | "ProgressPrecomputed" >> CountProgress(progress, "done"))
    else:
        to_embed = valid
    written = [valid | "WritePassages" >> WriteToParquet(files.join(index_dir, "shards", "passages"), PASSAGES,
                                                        file_name_suffix=".parquet"),
               dead | "WriteDeadLetters" >> WriteToParquet(files.join(index_dir, "dead_letters"), DEAD_LETTERS,
                                                           file_name_suffix=".parquet")]
    if dense:
        written.append(
            to_embed
            | "TextById" >> beam.Map(lambda r: (r["id"], passage_text(r["title"], r["text"])))
            # blocks fixed by the ids (a shuffle that also spreads them over the workers): the
            # model's batches are the same on every runner, so are the vectors, bit for bit
            | "BlockById" >> beam.Map(lambda kv: (embedding_block(kv[0], blocks), kv))
            | "EmbeddingBlocks" >> beam.GroupByKey()
            | "SortBlock" >> beam.MapTuple(lambda _, pairs: sorted(pairs))
            | "Embed" >> RunInference(BlockHandler(handler))
            | "PerPassage" >> beam.FlatMap(lambda result: result.inference)
            | "ProgressEmbedded" >> CountProgress(progress, "done")
            | "ToVectorRows" >> beam.Map(_vector_row)
            | "WriteEmbeddings" >> WriteToParquet(files.join(index_dir, "embeddings", "part"), EMBEDDINGS,
                                                  file_name_suffix=".parquet"))
    finish = IndexFinish(index_dir, kinds, embedder if dense else None, inputs, precomputed, dense_params)
    after_writes = [beam.pvalue.AsList(w) for w in written]  # side inputs: complete before it runs
    _ = p | "Once" >> beam.Create([None]) | "FinishIndex" >> beam.Map(lambda _, *done: finish(), *after_writes)


def _build_index(corpus: str, index_dir: str, kinds: list[str], *, embedder: str, num_threads: int,
                 beam_args: tuple[str, ...], dense_params: dict[str, dict] | None, backend: str,
                 backend_configs: tuple[Any, ...], embeddings: str | None) -> dict:
    bad = set(kinds) - set(KINDS)
    if bad or not kinds:
        raise ValueError(f"--kinds must name some of {', '.join(KINDS)}; got {kinds}")
    dense = any(k in DENSE_KINDS for k in kinds)
    patterns = [x for x in (embeddings or "").split(",") if x]
    precomputed = sorted({f for pattern in patterns for f in expand_inputs(pattern)})
    if precomputed and not dense:
        raise ValueError("--embeddings (precomputed vectors) needs a dense kind in --kinds")
    handler = BackendModelHandler(backend, embedder, "embed", num_threads=num_threads,
                                  configs=backend_configs) if dense else None
    inputs = expand_inputs(corpus)
    blocks = max(1, -(-(count_rows(inputs) or 0) // EMBED_BLOCK_ROWS))
    index_dir = str(index_dir)
    template = dataflow_template(beam_args)
    if template:
        p = new_pipeline(beam_args)
        _index_graph(p, corpus, index_dir, kinds, embedder=embedder, dense=dense, handler=handler,
                     precomputed=precomputed, inputs=inputs, blocks=blocks, dense_params=dense_params)
        p.run()  # Dataflow's runner stages the job and writes its description; nothing runs
        return {"job": "build-index", "template": template}
    files.mkdirs(index_dir)
    files.remove_tree(files.join(index_dir, "shards"))  # also a killed run's beam-temp folders
    files.remove_tree(files.join(index_dir, "embeddings"))
    files.delete(files.match_files(files.join(index_dir, "dead_letters*")))
    started = time.time()
    with watch_progress("build-index", index_dir, count_rows(inputs), unit="passages"), \
            new_pipeline(beam_args) as p:
        _index_graph(p, corpus, index_dir, kinds, embedder=embedder, dense=dense, handler=handler,
                     precomputed=precomputed, inputs=inputs, blocks=blocks, dense_params=dense_params)
    index_manifest = json.loads(files.read_text(files.join(index_dir, "manifest.json")))
    return write_manifest(index_dir, {"job": "build-index", "index": index_manifest, "beam_args": list(beam_args),
                                      "embedding": {"backend": backend, "model": embedder} if dense else None,
                                      "wall_s": round(time.time() - started, 3)}, name="build_manifest.json")
