"""The part of the answer job's graph that batch and streaming share: the method's stages over
the keyed queries, then the results and the dead letters each counted, reported to the progress
line and written as Parquet shards under the run's lease. The two graphs differ only before it
(a file read or a stream's admission, dedupe and windows) and in the shards' names and windows.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.utils.shared import Shared

from specrag.jobio.files import join
from specrag.schemas.tables import DEAD_LETTERS
from specrag.transforms.counters import count_dead_letter, counted_result_row
from specrag.transforms.progress import CountProgress, progress_dir
from specrag.transforms.sinks import WriteParquetShards
from specrag.transforms.stages import RunSegment, method_segments, segment_label


def run_method(keyed: beam.PCollection, job, execution: str, **segment_options) -> tuple[beam.PCollection, list]:
    """The job's method over ``(id, QueryState)`` pairs, a ``RunSegment`` per segment with one
    engine per worker process for all of them; returns the answered states and each segment's
    dead letters. ``segment_options``: RunSegment's batching (batch_size, num_shards)."""
    shared = Shared()
    failed = []
    for segment in method_segments(job.method.stages()):
        keyed, stage_dead = keyed | segment_label(segment) >> RunSegment(
            segment, job.runtime, shared, execution=execution, gather_timeout_s=job.gather_timeout_s,
            **segment_options)
        failed.extend(stage_dead)
    return keyed, failed


def write_results(answered: beam.PCollection, job, fingerprint: str, shards: str, lease_token: str | None,
                  windowed: bool = False) -> beam.PCollection:
    """Answered states → result rows (counted, on the progress line) → ``shards``-* Parquet
    files of the output; returns the rows."""
    rows = (answered
            | "ToResultRows" >> beam.Map(counted_result_row, job.method.name, fingerprint)
            | "ProgressAnswered" >> CountProgress(progress_dir(job.output), "done"))
    _ = rows | "WriteResults" >> WriteParquetShards(join(job.output, shards), job.method.results_schema(),
                                                    job.shard_rows, counter="results", lease_token=lease_token,
                                                    windowed=windowed)
    return rows


def write_dead_letters(dead: beam.PCollection, job, shards: str, lease_token: str | None, kind: str = "",
                       windowed: bool = False) -> beam.PCollection:
    """Dead letters (of one ``kind`` where a graph writes each kind apart) → counted, on the
    progress line → ``shards``-* Parquet files of the output; returns them."""
    dead = (dead
            | f"Count{kind}DeadLetters" >> beam.Map(count_dead_letter)
            | f"Progress{kind}Dead" >> CountProgress(progress_dir(job.output), "dead"))
    _ = dead | f"Write{kind}DeadLetters" >> WriteParquetShards(join(job.output, shards), DEAD_LETTERS, job.shard_rows,
                                                               counter="dead_letters", lease_token=lease_token,
                                                               windowed=windowed)
    return dead
