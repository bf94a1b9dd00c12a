"""BatchByKey on a real Beam runner: flush at size, flush the rest when input ends, chainable."""
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from specrag.transforms.batching import BatchByKey, shard_of


def _batches(elements, size, stages=1):
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        pcoll = p | beam.Create(elements)
        for s in range(stages):
            batches = (pcoll | f"Redistribute{s}" >> beam.Reshuffle()
                       | f"Batch{s}" >> beam.ParDo(BatchByKey(size)))
            pcoll = batches | f"Unbatch{s}" >> beam.FlatMap(lambda b: [(v % 2, v) for v in b])
        sizes = batches | beam.Map(len)
        values = batches | beam.FlatMap(lambda b: b)
        assert_that(values, equal_to([v for _, v in elements]), label="NothingLost")
        assert_that(sizes | "Total" >> beam.CombineGlobally(sum), equal_to([len(elements)]), label="Total")
        assert_that(sizes | "Max" >> beam.CombineGlobally(max), equal_to([size]), label="Max")


def test_batches_flush_at_size_and_at_end_of_input():
    _batches([(v % 2, v) for v in range(11)], 4)


def test_two_batching_stages_in_a_row_lose_nothing():
    # the second stage receives batches flushed by the first one's end-of-window timer
    _batches([(v % 2, v) for v in range(11)], 4, stages=2)


def test_shard_of_is_stable_and_in_range():
    assert [shard_of(f"q{i}", 4) for i in range(6)] == [shard_of(f"q{i}", 4) for i in range(6)]
    assert {shard_of(f"q{i}", 4) for i in range(100)} == {0, 1, 2, 3}
