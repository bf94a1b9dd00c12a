"""`specrag build-datastore`: corpus Parquet → KNN-LM datastore (Beam job + FAISS build).

The Beam job validates passages and runs the generator over them on the workers (teacher
forcing, each text alone), writing (passage id, position, key, value) shards. The
datastore is then assembled by one worker in a last stage of the job (`DatastoreFinish`), in
corpus order — passages by id, positions ascending — so an entry's successors are the contexts
that followed it, and indexed (exact and HNSW L2).
Every read and write goes through FileSystems: a datastore on gs:// or s3:// is built in a
local staging folder and published there, manifest last.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.parquetio import WriteToParquet

from specrag.pipelines.manifest import write_manifest
from specrag.pipelines.options import new_pipeline
from specrag.retrieval.base import passage_text
from specrag.retrieval.datastore import KINDS, write_datastore
from specrag.schemas.tables import DEAD_LETTERS, PASSAGE_COLUMNS
from specrag.schemas.validation import validate_passage
from specrag.jobio import files
from specrag.jobio.job_run import job_run
from specrag.jobio.run_folder import DATASTORE
from specrag.transforms.parquet_io import ReadParquetRows
from specrag.jobio.inputs import dataset_fingerprint, expand_inputs, expand_tables
from specrag.transforms.progress import CountProgress, count_rows, progress_dir, watch_progress
from specrag.transforms.runtime import load_backend
from specrag.transforms.validate import ValidateRows

ENTRIES = pa.schema([pa.field("passage", pa.string()), pa.field("position", pa.int32()),
                     pa.field("key", pa.list_(pa.float32())), pa.field("value", pa.int64())])


class ContextStates(beam.DoFn):
    """A batch of passages → one row per (context, next token); the model loads once per worker."""

    def __init__(self, model: str, num_threads: int, max_tokens: int, dtype: str):
        self.model, self.num_threads, self.max_tokens, self.dtype = model, num_threads, max_tokens, dtype

    def setup(self):
        self.lm = load_backend("local", self.model, self.num_threads, self.dtype)

    def process(self, batch: list[dict]):
        states = self.lm.token_states([passage_text(p["title"], p["text"]) for p in batch], self.max_tokens)
        for p, (keys, values) in zip(batch, states):
            for pos, (key, value) in enumerate(zip(keys, values)):
                yield {"passage": p["id"], "position": pos, "key": key.tolist(), "value": int(value)}


def passages_for_entries(inputs: list[str], model: str, max_tokens: int, max_entries: int) -> set[str]:
    """Ids of the first passages in corpus order (by id) that hold the first ``max_entries``
    entries, counted with the model's tokenizer as ``token_states`` cuts them: the job runs the
    model over these alone instead of the whole corpus (a 200k-entry datastore of a 15k-passage
    corpus is an eighth of its tokens)."""
    from transformers import AutoTokenizer
    from specrag.inference.models import materialise
    from specrag.schemas.validation import RowError
    tokenizer = AutoTokenizer.from_pretrained(materialise(model))
    rows = []
    for f in inputs:
        for r in files.read_parquet(f).to_pylist():
            try:
                rows.append(validate_passage(r))
            except RowError:
                continue  # the job's validation makes it a dead letter
    rows.sort(key=lambda r: r["id"])
    keep, total = set(), 0
    for r in rows:
        if total >= max_entries:
            break
        n = len(tokenizer(passage_text(r["title"], r["text"]), add_special_tokens=False)["input_ids"][:max_tokens])
        keep.add(r["id"])
        total += max(0, n - 1)
    return keep


class DatastoreFinish:
    """The datastore (keys in corpus order, FAISS indexes) from the job's entry shards, built by one
    worker in a last stage of the job, never on the launcher: a remote folder is built in a local
    staging folder and published."""

    def __init__(self, out: str, model: str, kinds: tuple[str, ...], max_entries: int | None, inputs: list[str],
                 max_tokens: int, dtype: str):
        self.out, self.model, self.kinds, self.max_entries = out, model, kinds, max_entries
        self.inputs, self.max_tokens, self.dtype = inputs, max_tokens, dtype

    def __call__(self) -> None:
        out = self.out
        shards = sorted(files.match_files(files.join(out, "entries", "*.parquet")))
        table = pa.concat_tables([files.read_parquet(f) for f in shards])
        table = table.sort_by([("passage", "ascending"), ("position", "ascending")])
        if self.max_entries is not None:
            table = table.slice(0, self.max_entries)
        keys = np.asarray(table.column("key").combine_chunks().flatten().to_numpy(zero_copy_only=False),
                          dtype=np.float32).reshape(table.num_rows, -1)
        values = table.column("value").to_numpy()
        local = files.is_local(out)
        stage = Path(out) if local else Path(tempfile.mkdtemp(prefix="specrag-datastore-"))
        try:
            write_datastore(keys, values, stage, self.model, self.kinds, {
                "corpus": dataset_fingerprint(self.inputs), "max_tokens": self.max_tokens, "dtype": self.dtype,
                "passages": len(set(table.column("passage").to_pylist()))})
            if not local:
                files.publish(stage, out)
        finally:
            if not local:
                shutil.rmtree(stage, ignore_errors=True)


def run_build_datastore(corpus: str, out_dir: str, *, model: str = "smollm2-135m-instruct", max_tokens: int = 128,
                        max_entries: int | None = None, kinds: tuple[str, ...] = KINDS, num_threads: int = 1,
                        dtype: str = "float32", beam_args: tuple[str, ...] = ("--runner=FnApiRunner",),
                        overwrite: bool = False, max_failure_fraction: float = 1.0) -> dict:
    """Build KNN-LM's datastore in ``out_dir``; returns the job manifest. An existing datastore is
    replaced only with ``overwrite`` (and comes back if the rebuild fails); raises RunFailed, the
    datastore written, when more passages than ``max_failure_fraction`` ended as dead letters."""
    expand_tables(corpus, PASSAGE_COLUMNS, "corpus")  # before the folder is touched
    with job_run(str(out_dir), DATASTORE, overwrite=overwrite) as run:
        manifest = _build_datastore(corpus, str(out_dir), model=model, max_tokens=max_tokens, max_entries=max_entries,
                                    kinds=kinds, num_threads=num_threads, dtype=dtype, beam_args=beam_args)
        run.judge(run.folder.account(manifest["datastore"]["passages"]), max_failure_fraction)
    return manifest


def _build_datastore(corpus: str, out: str, *, model: str, max_tokens: int, max_entries: int | None,
                     kinds: tuple[str, ...], num_threads: int, dtype: str, beam_args: tuple[str, ...]) -> dict:
    inputs = expand_inputs(corpus)
    # earlier entries (also a killed run's beam-temp folders) and dead letters
    files.remove_tree(files.join(out, "entries"))
    files.delete(files.match_files(files.join(out, "dead_letters*")))
    started = time.time()
    needed = passages_for_entries(inputs, model, max_tokens, max_entries) if max_entries is not None else None
    progress = progress_dir(out)
    with watch_progress("build-datastore", out, count_rows(inputs), unit="passages"), \
            new_pipeline(beam_args) as p:
        valid, dead = p | "ValidatePassages" >> ValidateRows(ReadParquetRows(corpus), validate_passage)
        dead | "ProgressDead" >> CountProgress(progress, "dead") | "WriteDeadLetters" >> WriteToParquet(files.join(out, "dead_letters"), DEAD_LETTERS,
                                                    file_name_suffix=".parquet")
        entries = (valid
                   | "ProgressPassages" >> CountProgress(progress, "done")  # one by one into the fused batching stage
                   | "NeededPassages" >> beam.Filter(lambda p, ids: ids is None or p["id"] in ids, needed)
                   | "SpreadPassages" >> beam.Reshuffle()  # over the workers: a corpus may be one row group
                   | "BatchPassages" >> beam.BatchElements(min_batch_size=8, max_batch_size=32)
                   | "ContextStates" >> beam.ParDo(ContextStates(model, num_threads, max_tokens, dtype))
                   | "WriteEntries" >> WriteToParquet(files.join(out, "entries", "part"), ENTRIES,
                                                      file_name_suffix=".parquet"))
        finish = DatastoreFinish(out, model, kinds, max_entries, inputs, max_tokens, dtype)
        _ = (p | "Once" >> beam.Create([None])
             | "FinishDatastore" >> beam.Map(lambda _, done: finish(), beam.pvalue.AsList(entries)))
    manifest = json.loads(files.read_text(files.join(out, "manifest.json")))
    return write_manifest(out, {"job": "build-datastore", "datastore": manifest, "beam_args": list(beam_args),
                                "wall_s": round(time.time() - started, 3)}, name="job_manifest.json")
