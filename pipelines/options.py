"""specrag's options as Beam PipelineOptions: one class per job, plus the shared ones.

They are the same flags the CLI parses, defined once: ``specrag COMMAND --help`` lists them
by class, Beam knows them (a flag that neither specrag nor Beam defines is an error, never
silently dropped) and they travel with the job's pipeline options to the runner and its
workers. Each flag has a dashed spelling and Beam's underscored one (``--max-in-flight`` or
``--max_in_flight``). Nothing is ``required`` here (Beam parses every options class for
every job); each job's ``validate`` says what is missing.

Example usage::

    options = PipelineOptions(["--queries=q.parquet", "--output=out", "--index=idx"])
    answer = options.view_as(AnswerOptions)
    answer.validate()
    output = options.view_as(OutputOptions).output
    runtime = options.view_as(RuntimeOptions).runtime_config()
"""
from __future__ import annotations

import argparse
import functools
import os
from dataclasses import dataclass

from apache_beam.options.pipeline_options import PipelineOptions

from specrag import registry
from specrag.wording import count

def in_process_runner(options: PipelineOptions) -> bool:
    """Whether the job's workers run on this machine (the FnApiRunner, named or by default)."""
    from apache_beam.options.pipeline_options import StandardOptions
    return (options.view_as(StandardOptions).runner or "FnApiRunner").lower() in ("fnapirunner", "directrunner")


def default_threads(runner: str | None, workers: int | None) -> int:
    """Torch threads per worker process when neither --threads nor SPECRAG_THREADS says: the
    machine's cores over the worker processes the in-process runner starts (workers x threads =
    cores); one on any other runner, whose workers' cores are not this machine's."""
    env = os.environ.get("SPECRAG_THREADS")
    if env:
        return int(env)
    if not in_process_runner(PipelineOptions([f"--runner={runner}"] if runner else [])):
        return 1
    return max(1, (os.cpu_count() or 1) // max(1, workers or 1))


def _flag(parser, name: str, **kwargs) -> None:
    dashed, underscored = f"--{name.replace('_', '-')}", f"--{name}"
    names = [dashed] if dashed == underscored else [dashed, underscored]
    parser.add_argument(*names, dest=name, **kwargs)


def _backend_flag(parser, backend: str, option: str, **kwargs) -> None:
    _flag(parser, f"{backend}_{option}".replace("-", "_"), **kwargs)


def _backend_value(options: PipelineOptions, backend: str, option: str):
    return getattr(options, f"{backend}_{option}".replace("-", "_"))


def _missing(options: PipelineOptions, job: str, names: tuple[str, ...]) -> None:
    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(options, n) in (None, "")]
    if missing:
        raise ValueError(f"{job} needs {', '.join(missing)}")


class ModelOptions(PipelineOptions):
    """Where a job's models run: backend, models by role, threads, dtype (every job with a model)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        from specrag.inference.processor import DTYPES
        group = parser.add_argument_group("models")
        _flag(group, "backend", default="local",
              help="local: models in the worker process; triton: a Triton server (--triton-url); vllm: vLLM's "
                   "engine, a server per worker process (make install-vllm) or --vllm-url")
        for name in registry.BACKENDS:  # each backend's own flags, --BACKEND-OPTION (ModelBackend.add_options)
            registry.BACKENDS[name].add_options(functools.partial(_backend_flag, group, name))
        _flag(group, "model", action="append", metavar="ROLE=NAME",
              help="model for a role, e.g. generator=smollm2-135m-instruct, embedder=all-minilm-l6-v2")
        _flag(group, "threads", type=int, default=None,
              help="torch threads per worker process (default: SPECRAG_THREADS, else the machine's cores over the "
                   "in-process runner's worker processes, 1 on other runners)")
        _flag(group, "dtype", default="auto", choices=DTYPES,
              help="auto: bfloat16 where the CPU has AMX or AVX512-BF16 (native bf16 matmuls), else float32; "
                   "bfloat16 elsewhere is emulated and slow (it warns); int8: dynamic int8 quantisation of the "
                   "linear layers (CPU); bfloat16-prefill: bfloat16 prefill and scoring, float32 decode steps "
                   "(local backend; a second float32 copy of each causal LM); results are not bit-equal across dtypes")

    def backend_configs(self) -> tuple:
        """The backends' own configurations from their flags (``ModelBackend.config_from_options``),
        in the registry's order."""
        configs = []
        for name in registry.BACKENDS:
            value = functools.partial(_backend_value, self, name)
            config = registry.BACKENDS[name].config_from_options(value, chosen=name == self.backend)
            if config is not None:
                configs.append(config)
        return tuple(configs)

    def models_by_role(self, defaults: dict[str, str], roles: tuple[str, ...] | None = None,
                       who: str = "this job") -> dict[str, str]:
        """Models by role: ``defaults`` overridden by --model. With ``roles`` (the roles the job
        or method has), a --model naming another role is an error, not silently unused."""
        models = dict(defaults)
        for spec in self.model or []:
            role, sep, name = spec.partition("=")
            if not sep or not role or not name:
                raise ValueError(f"--model expects ROLE=NAME (e.g. generator=smollm2-135m-instruct), got {spec!r}")
            if roles is not None and role not in roles:
                raise ValueError(f"--model {spec}: {who} has no model role {role!r}; its roles: "
                                 f"{', '.join(roles) or 'none'}")
            models[role] = name
        return models


class IndexFolderOptions(PipelineOptions):
    """--index: what build-index writes and answer reads."""

    @classmethod
    def _add_argparse_args(cls, parser):
        _flag(parser.add_argument_group("index"), "index",
              help="index folder (`specrag build-index` writes it; any FileSystems path)")


class DatastoreFolderOptions(PipelineOptions):
    """--datastore: what build-datastore writes and KNN-LM reads."""

    @classmethod
    def _add_argparse_args(cls, parser):
        _flag(parser.add_argument_group("datastore"), "datastore",
              help="KNN-LM datastore folder (`specrag build-datastore` writes it)")


class RuntimeOptions(PipelineOptions):
    """What answer's methods read and how its engine runs: retriever, datastore kind, triplets,
    prefix reuse, micro-batching, admission and timeouts; with the models (ModelOptions), the index
    and the datastore, read through their own views.

    Every options class derives from PipelineOptions directly: Beam serialises a job's options
    to its workers from PipelineOptions' direct subclasses only (``get_all_options``)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        from specrag.transforms.runtime import default_prefix_cache_mb
        group = parser.add_argument_group("runtime (retrieval, engine)")
        _flag(group, "datastore_kind", default="flat", help="flat (exact) | hnsw")
        _flag(group, "triplets", help="triplet sets of the index's passages (`specrag extract-triplets` writes them; "
                                      "AED-RAG reads them)")
        _flag(group, "retriever", default="bm25", help="bm25 | lucene | dense (exact) | hnsw | ivf")
        _flag(group, "exact_scan", default="int8", choices=("int8", "bf16", "fp32", "faiss"),
              help="candidate pass of exact dense and datastore search on CPU (results are exact in every "
                   "case): int8 (fbgemm; default), bf16 (AMX CPUs), fp32, or faiss (FAISS's own scan)")
        _flag(group, "prefix_cache_mb", type=int, default=None,
              help="prefix KV reuse: MiB of prompt and continuation KV each local LM keeps per worker (0: off; "
                   f"default {default_prefix_cache_mb('local')} on the local backend, and a resumed run keeps its own); a "
                   "request that extends an earlier one's tokens (RaLM and KNN-LM steps) prefills only the rest")
        _flag(group, "engine_batch", type=int, default=16, help="max requests per batched model call")
        _flag(group, "engine_wait", type=float, default=0.005, help="max seconds a request waits for a batch")
        _flag(group, "max_in_flight", type=int, default=64,
              help="queries running at once in one worker's engine (backpressure beyond)")
        _flag(group, "stage_timeout", type=float, default=600.0,
              help="seconds one stage of one query may run, its calls' service included, before the query "
                   "becomes a dead letter (time queued behind other queries' calls does not count); a loop "
                   "stage (SARDI's denoising, RaLM's and KNN-LM's tokens, AR retrieval, SPS's stages) gets "
                   "it for each step")
        _flag(group, "queue_timeout", type=float, default=3600.0,
              help="the most time queued behind other queries' calls that --stage-timeout leaves out")

    def models_by_role(self, defaults: dict[str, str], roles: tuple[str, ...] | None = None,
                       who: str = "this job") -> dict[str, str]:
        return self.view_as(ModelOptions).models_by_role(defaults, roles, who)

    # the models', index's and datastore's flags, as the job's runtime reads them
    backend = property(lambda self: self.view_as(ModelOptions).backend)
    model = property(lambda self: self.view_as(ModelOptions).model)
    @property
    def threads(self) -> int:
        from apache_beam.options.pipeline_options import DirectOptions, StandardOptions
        given = self.view_as(ModelOptions).threads
        return given if given is not None else default_threads(self.view_as(StandardOptions).runner,
                                                               self.view_as(DirectOptions).direct_num_workers)

    def workers_line(self, job: str) -> str:
        """The start line: what of the machine the job's in-process workers use."""
        from apache_beam.options.pipeline_options import DirectOptions
        workers = max(1, self.view_as(DirectOptions).direct_num_workers or 1)
        return (f"{job}: {count(workers, 'worker process', 'worker processes')} x {count(self.threads, 'torch thread')} "
                f"({count(os.cpu_count() or 1, 'core')}; --threads, --direct_num_workers to change)")
    dtype = property(lambda self: self.view_as(ModelOptions).dtype)
    index = property(lambda self: self.view_as(IndexFolderOptions).index)
    datastore = property(lambda self: self.view_as(DatastoreFolderOptions).datastore)

    def roles_for(self, method) -> tuple[str, ...]:
        """A method's model roles, with the embedder where the retriever embeds queries."""
        from specrag.retrieval.index import DENSE_KINDS
        extra = ("embedder",) if (method.needs_retriever and self.retriever in DENSE_KINDS
                                  and "embedder" not in method.model_roles) else ()
        return tuple(method.model_roles) + extra

    def runtime_config(self, method=None):
        """The RuntimeConfig these options describe (validated against a method by the job);
        with ``method``, only its roles, and a --model of another role is an error."""
        from specrag.inference.engine import EngineConfig
        from specrag.inference.processor import resolve_dtype
        from specrag.transforms.runtime import ROLE_DEFAULT_MODELS, RuntimeConfig, default_prefix_cache_mb
        roles = self.roles_for(method) if method is not None else None
        defaults = dict(RuntimeConfig().models) | {r: m for r, m in ROLE_DEFAULT_MODELS.items() if r in (roles or ())}
        models = self.models_by_role(defaults, roles, f"method {getattr(method, 'name', '')!r}")
        config = RuntimeConfig(backend=self.backend, models=tuple(sorted(models.items())), index_dir=self.index,
                               retriever=self.retriever, num_threads=self.threads,
                               dtype=resolve_dtype(self.dtype, self.backend),
                               engine=EngineConfig(max_batch=self.engine_batch, max_wait_s=self.engine_wait,
                                                   max_in_flight=self.max_in_flight,
                                                   stage_timeout_s=self.stage_timeout,
                                                   queue_timeout_s=self.queue_timeout),
                               backend_configs=self.view_as(ModelOptions).backend_configs(),
                               datastore_dir=self.datastore,
                               datastore_kind=self.datastore_kind,
                               triplets_dir=self.triplets, exact_scan=self.exact_scan,
                               prefix_cache_mb=default_prefix_cache_mb(self.backend)
                               if self.prefix_cache_mb is None else self.prefix_cache_mb)
        return config.with_roles(method.model_roles) if method is not None else config


class GrowOptions(PipelineOptions):
    """`specrag answer --resume --grow-from`: an earlier run over a smaller query set grows."""

    @classmethod
    def _add_argparse_args(cls, parser):
        _flag(parser.add_argument_group("output"), "grow_from", default=None, metavar="EARLIER_QUERIES",
              help="with --resume, the queries the earlier attempts answered when --queries holds them and "
                   "more (a longer prefix of the same set): their results are kept once every earlier row is "
                   "found in --queries unchanged")


class OutputOptions(PipelineOptions):
    """Where a job writes (answer, extract-triplets), and what it does with unreadable input."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("output")
        _flag(group, "output", help="output folder (any FileSystems path); required")
        _flag(group, "resume", action="store_true",
              help="keep earlier output in --output and process only the rows without one")
        _flag(group, "bad_files", default="fail", choices=("fail", "dead-letter"),
              help="an unreadable input file stops the job at start (fail) or becomes one "
                   "dead letter naming it while the other files are processed")


class ReplaceOptions(PipelineOptions):
    """What every Beam job does with earlier output in its folder and with failed rows."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("earlier output and failures")
        _flag(group, "overwrite", action="store_true",
              help="replace what the output folder already holds (refused without it)")
        _flag(group, "max_failure_fraction", type=float, default=0.5,
              help="exit non-zero (after writing everything) when a larger share of the input ends as dead letters")

    def validate(self) -> None:
        if not 0.0 <= self.max_failure_fraction <= 1.0:
            raise ValueError(f"--max-failure-fraction must be in [0, 1], got {self.max_failure_fraction}")


@dataclass(frozen=True)
class StreamSettings:
    window_s: float = 60.0  # event-time window: results and manifest counts per window
    allowed_lateness_s: float = 600.0  # a row this much behind its arrival is a "late" dead letter
    dedupe_horizon_s: float = 86400.0  # how long (event time) an answered id is remembered
    poll_interval_s: float = 10.0  # how often a watched folder is listed
    stop_after_s: float | None = None  # stop watching after this long (None: until cancelled)
    event_time_field: str | None = None  # a row field holding its event time (else: when it arrived)
    timestamp_attribute: str | None = None  # Pub/Sub: the message attribute holding its event time

    def validate(self) -> None:
        for name in ("window_s", "poll_interval_s", "dedupe_horizon_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name[:-2].replace('_', '-')} must be > 0 seconds, got {getattr(self, name)}")
        if self.allowed_lateness_s < 0:
            raise ValueError(f"--allowed-lateness must be >= 0 seconds, got {self.allowed_lateness_s}")
        if self.stop_after_s is not None and self.stop_after_s <= 0:
            raise ValueError(f"--stop-after must be > 0 seconds, got {self.stop_after_s}")


class FlinkRunnerSettings(PipelineOptions):
    """Beam's Flink runner's settings that Beam's Python SDK does not declare: declared here so
    they reach the Flink job server (it reads them as its FlinkPipelineOptions)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("flink runner settings (FlinkRunner)")
        _flag(group, "max_bundle_size", type=int, default=None,
              help="elements per bundle on Flink (its default: 1000)")
        _flag(group, "max_bundle_time_millis", type=int, default=None,
              help="milliseconds before Flink finishes a bundle (its default: 1000)")
        _flag(group, "shutdown_sources_after_idle_ms", type=int, default=None,
              help="milliseconds Flink keeps a source that has emitted everything (its default without "
                   "checkpointing: 0); a streaming job on Flink keeps its sources up")
        _flag(group, "pipeline_resources_detector_factory_class", default=None,
              help="the Java class that picks the jars the Flink job server ships with a job (its default: "
                   "all of its classpath); deploy/flink's cluster has Beam's runner on its TaskManagers and "
                   "names one that ships none (`launch.py flags`)")


class StreamOptions(PipelineOptions):
    """`specrag answer --streaming` (Beam's flag): an unbounded source answered as it arrives."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("streaming (with --streaming; --queries a folder/, a glob, or "
                                          "pubsub:projects/P/subscriptions/S)")
        _flag(group, "window", type=float, default=60.0,
              help="event-time window in seconds: results and manifest counts are written per window")
        _flag(group, "allowed_lateness", type=float, default=600.0,
              help="seconds a row's event time may lag its arrival; a later row is a 'late' dead letter")
        _flag(group, "dedupe_horizon", type=float, default=86400.0,
              help="seconds (event time) an admitted id is remembered: a row with it is a repeat or a duplicate")
        _flag(group, "poll_interval", type=float, default=10.0, help="seconds between two listings of a watched folder")
        _flag(group, "stop_after", type=float, default=None,
              help="stop watching after this many seconds (default: run until cancelled)")
        _flag(group, "event_time_field", default=None,
              help="a row field holding its event time (epoch seconds or ISO 8601); default: when it arrived")
        _flag(group, "pubsub_timestamp_attribute", default=None,
              help="Pub/Sub: the message attribute holding its event time (default: the publish time)")

    def settings(self):
        stream = StreamSettings(window_s=self.window, allowed_lateness_s=self.allowed_lateness,
                                dedupe_horizon_s=self.dedupe_horizon, poll_interval_s=self.poll_interval,
                                stop_after_s=self.stop_after, event_time_field=self.event_time_field,
                                timestamp_attribute=self.pubsub_timestamp_attribute)
        stream.validate()
        return stream


class AnswerOptions(PipelineOptions):
    """`specrag answer`: queries in, a method's answers out (--output and friends: OutputOptions)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("answer")
        _flag(group, "queries", help="Parquet, JSON lines (.jsonl) or CSV file, a folder of them, or a glob "
                                       "(any FileSystems path); columns id, question; required")
        _flag(group, "limit", type=int, default=None,
              help="answer only the first N queries (files in sorted order, then row order); a later "
                   "--resume with a larger --limit grows the run")
        _flag(group, "method", default="standard", help="a registered method (listed below)")
        _flag(group, "set", action="append", metavar="KEY=VALUE",
              help="method setting, parsed to the setting's type, e.g. top_k=5")
        _flag(group, "execution", default="streaming", choices=("streaming", "fixed-batch"),
              help="streaming: queries enter the per-worker engine as they arrive; "
                   "fixed-batch: the earlier batch-at-a-time execution (for comparisons)")
        _flag(group, "batch_size", type=int, default=16, help="queries per batch (fixed-batch execution)")
        _flag(group, "shards", type=int, default=4, help="shard keys for keyed batching (fixed-batch execution)")
        _flag(group, "shard_rows", type=int, default=1000,
              help="results are written in Parquet shards of this many rows as queries finish "
                   "(what a killed run keeps for --resume)")
        _flag(group, "gather_timeout", type=float, default=None,
              help="seconds a fanned-out query waits for all its parts before going to dead letters "
                   "(streaming; in batch runs the end of input expires incomplete queries)")

    def validate(self) -> None:
        _missing(self, "specrag answer", ("queries",))
        _missing(self.view_as(OutputOptions), "specrag answer", ("output",))


class CorpusOptions(PipelineOptions):
    """The passages a corpus job reads (build-index, build-datastore, extract-triplets)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("corpus")
        _flag(group, "corpus", help="passages: a Parquet, JSON lines or CSV file, a folder of them, or a glob "
                                      "(columns id, text, optional title); required")


class KindsOptions(PipelineOptions):
    """--kinds: what build-index and build-datastore build."""

    @classmethod
    def _add_argparse_args(cls, parser):
        _flag(parser.add_argument_group("corpus"), "kinds",
              help="comma-separated kinds to build (build-index: bm25,lucene,dense,hnsw,ivf, default bm25; "
                   "build-datastore: flat,hnsw, default both)")


class BuildIndexOptions(PipelineOptions):
    """`specrag build-index`: passages → index folder (--index); embeds with --model embedder=NAME;
    an existing index is replaced only with --overwrite."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("build-index")
        _flag(group, "dense_shards", type=int, default=1,
              help="FAISS indexes in N row-range shards; search merges their top-k")
        _flag(group, "embeddings", help="precomputed (id, vector) Parquet: files or globs, comma-separated, of the "
                                        "same embedder; their passages are not embedded again (dense kinds)")

    def validate(self) -> None:
        _missing(self.view_as(CorpusOptions), "specrag build-index", ("corpus",))
        _missing(self.view_as(RuntimeOptions), "specrag build-index", ("index",))
        if self.dense_shards < 1:
            raise ValueError("--dense-shards must be >= 1")


class BuildDatastoreOptions(PipelineOptions):
    """`specrag build-datastore`: passages → KNN-LM datastore (--datastore) of --model generator=NAME;
    an existing datastore is replaced only with --overwrite."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("build-datastore")
        _flag(group, "max_tokens", type=int, default=128, help="tokens per passage")
        _flag(group, "max_entries", type=int, default=None, help="keep the first N entries in corpus order")

    def validate(self) -> None:
        _missing(self.view_as(CorpusOptions), "specrag build-datastore", ("corpus",))
        _missing(self.view_as(RuntimeOptions), "specrag build-datastore", ("datastore",))
        if self.max_tokens < 1:
            raise ValueError("--max-tokens must be >= 1")


class ExtractTripletsOptions(PipelineOptions):
    """`specrag extract-triplets`: passages → triplets Parquet in --output."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("extract-triplets")
        _flag(group, "extractor", default="spacy-rules",
              help="spacy-rules: dependency rules over en_core_web_sm parses (default); "
                   "generator: --model generator=NAME prompted for <head; relation; tail> lines (local or triton)")
        _flag(group, "extract_batch", type=int, default=64, help="passages per extractor call (at most)")
        _flag(group, "max_chars", type=int, default=100_000,
              help="a longer passage is a dead letter (the parser's memory grows with the input)")
        _flag(group, "shard_passages", type=int, default=5000,
              help="passages per output shard pair, written as they finish (what --resume keeps)")
        _flag(group, "keep_pronouns", action="store_true",
              help="spacy-rules: keep subject pronouns (he, she, it, they) instead of reading them as the "
                   "passage's title")
        _flag(group, "max_new_tokens_triplets", type=int, default=160,
              help="generator: tokens generated per passage")

    def validate(self) -> None:
        _missing(self.view_as(CorpusOptions), "specrag extract-triplets", ("corpus",))
        _missing(self.view_as(OutputOptions), "specrag extract-triplets", ("output",))


# Beam's PortableRunner (and the Flink, Spark and Prism runners built on it) reads the job's
# state stream with a gRPC deadline of --job_server_timeout seconds (default 300): a job that
# runs longer fails with DEADLINE_EXCEEDED although it is healthy. Batch jobs here run for hours.
LONG_JOB_TIMEOUT_S = 7 * 24 * 3600


def is_portable_runner(options: PipelineOptions) -> bool:
    """Whether the options' runner, in any spelling Beam accepts (``--runner flink``,
    ``--runner=PortableRunner``, a class path), runs on a job service."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.portability.portable_runner import PortableRunner
    from apache_beam.runners.runner import create_runner
    name = options.view_as(StandardOptions).runner
    if not name:
        return False
    try:
        return isinstance(create_runner(name), PortableRunner)
    except (ValueError, ImportError, AttributeError):  # not a runner Beam knows: Beam says so when the job starts
        return False


def pipeline_options(beam_args: tuple[str, ...] | list[str]) -> PipelineOptions:
    """A job's PipelineOptions; on a portable runner, a job-server deadline that fits a long job
    unless the user set one."""
    args = list(beam_args)
    options = PipelineOptions(args)
    if is_portable_runner(options) and "job_server_timeout" not in options.get_all_options(drop_default=True):
        args.append(f"--job_server_timeout={LONG_JOB_TIMEOUT_S}")
        options = PipelineOptions(args)
    return options


def dataflow_template(beam_args: tuple[str, ...] | list[str]) -> str | None:
    """Where Dataflow's runner writes a classic template of the job (``--template_location``), or
    None. Such a run builds the job and stages it (the pipeline proto under
    ``--staging_location``), writes the job's description at that path and submits nothing, so a
    job command returns once it is written: no output folder is touched, no lease taken. Running
    the template later (``gcloud dataflow jobs run``) runs the graph without specrag's launcher —
    no manifest, lease or reconciliation; the Flex Template (deploy/beam/flex_template) runs the
    launcher, which a production run on Dataflow wants."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions
    options = PipelineOptions(list(beam_args))
    if "dataflow" not in (options.view_as(StandardOptions).runner or "").lower():
        return None
    return options.view_as(GoogleCloudOptions).template_location or None


# Flags whose values are files or folders the workers read or write.
PATH_FLAGS = frozenset({"queries", "output", "index", "datastore", "triplets", "corpus", "embeddings"})


def _flag_name(token: str) -> str:
    return token[2:].split("=", 1)[0].replace("-", "_")


def worker_visible_paths(flags: list[str]) -> list[str]:
    """The job's flags with every relative local path made absolute, and a local path refused
    where no worker can read it.

    A worker of a portable runner (Flink, an EXTERNAL worker pool) runs in another folder, so a
    relative path names another file there or none; Dataflow's workers see no local file at all.
    Model specs (``--model ROLE=SPEC``) that are local folders or files are made absolute too."""
    from apache_beam.options.pipeline_options import StandardOptions
    runner = (PipelineOptions(list(flags)).view_as(StandardOptions).runner or "").lower()
    remote_only = "dataflow" in runner
    out, pending = [], None
    for token in flags:
        name = pending
        pending = None
        if name is None and token.startswith("--"):
            flag = _flag_name(token)
            if flag in PATH_FLAGS or flag == "model":
                if "=" not in token:
                    pending = flag
                else:
                    value = token.split("=", 1)[1]
                    out.append(token[:len(token) - len(value)] + _visible(flag, value, remote_only))
                    continue
            out.append(token)
            continue
        out.append(_visible(name, token, remote_only) if name else token)
    return out


def _visible(flag: str, value: str, remote_only: bool) -> str:
    from specrag.jobio.files import is_local
    if flag == "model":  # ROLE=SPEC: only a spec that is a local file or folder is a path
        role, _, spec = value.partition("=")
        return f"{role}={os.path.abspath(spec)}" if spec and not os.path.isabs(spec) and os.path.exists(spec) \
            else value
    if not value or not is_local(value) or value.startswith("pubsub:"):
        return value
    if value.endswith("/"):  # a folder (a streaming job watches it): keep the slash that says so
        return os.path.abspath(value) + "/" if not remote_only else _visible(flag, value.rstrip("/"), True)
    if remote_only:
        raise ValueError(f"--{flag.replace('_', '-')} {value} is a local path, which Dataflow's workers cannot "
                         "read or write: give a gs:// (or other shared filesystem) path")
    return os.path.abspath(value)


def _is_fn_api_runner(options: PipelineOptions) -> bool:
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.runners.runner import create_runner
    name = options.view_as(StandardOptions).runner
    try:
        return bool(name) and isinstance(create_runner(name), FnApiRunner)
    except (ValueError, ImportError, AttributeError):
        return False


def _specrag_option_names() -> set[str]:
    import argparse
    parser = argparse.ArgumentParser(add_help=False)
    for cls in {c for classes in JOB_OPTIONS.values() for c in classes}:
        cls._add_argparse_args(parser)  # noqa: SLF001
    return {a.dest for a in parser._actions}  # noqa: SLF001


def _fold_fn_api_metrics_eagerly() -> None:
    """The FnApiRunner folds each bundle's metrics into a lazy generator over the fold before it
    (Beam 2.77): a streaming job's many poll rounds keep every bundle's metrics alive (GBs over
    half an hour) and reading them at the end walks one generator per bundle (a 40 s stream took
    38 s more to report). Folded as each bundle ends, a stage keeps one consolidated list; the
    values are the same."""
    from apache_beam.metrics import monitoring_infos
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    if getattr(fn_runner.consolidate_monitoring_infos, "eager", False):
        return

    def eager(infos):
        return list(monitoring_infos.consolidate(infos))
    eager.eager = True
    fn_runner.consolidate_monitoring_infos = eager


def new_pipeline(beam_args: tuple[str, ...] | list[str]):
    """A job's ``beam.Pipeline`` whose workers, in every process, get the job's options.

    An explicitly named FnApiRunner hands its worker processes
    (``--direct_running_mode=multi_processing``) no options, so their filesystems have no S3
    endpoint or credentials; Beam's DirectRunner provisions them as below, and so does every
    runner with its own workers (Dataflow, Flink/Portable through the job's provision info)."""
    import apache_beam as beam
    _fold_fn_api_metrics_eagerly()
    options = pipeline_options(beam_args)
    if not _is_fn_api_runner(options):
        return beam.Pipeline(options=options)
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.runners.portability.fn_api_runner.fn_runner import ExtendedProvisionInfo
    from apache_beam.runners.portability.portable_runner import JobServiceHandle
    # Beam's own options only: a worker process parses them without specrag's option classes (it
    # would log every specrag flag as unparseable), and specrag's settings travel inside its DoFns
    ours = _specrag_option_names()
    beam_only = {k: v for k, v in options.get_all_options().items() if k not in ours}
    encoded = JobServiceHandle.encode_pipeline_options(beam_only)
    provision = ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return beam.Pipeline(runner=FnApiRunner(provision_info=provision), options=options)


# each command's own flags (its --help, and what it refuses as unknown); a job reads its options
# with view_as(RuntimeOptions) all the same, with the defaults of the flags it does not take
JOB_OPTIONS = {
    "answer": (AnswerOptions, OutputOptions, GrowOptions, ReplaceOptions, ModelOptions, IndexFolderOptions, DatastoreFolderOptions,
               RuntimeOptions, StreamOptions),
    "extract-triplets": (ExtractTripletsOptions, CorpusOptions, OutputOptions, ReplaceOptions, ModelOptions),
    "build-index": (BuildIndexOptions, CorpusOptions, KindsOptions, ReplaceOptions, ModelOptions, IndexFolderOptions),
    "build-datastore": (BuildDatastoreOptions, CorpusOptions, KindsOptions, ReplaceOptions, ModelOptions, DatastoreFolderOptions),
}


def unknown_beam_flags(args: list[str]) -> list[str]:
    """Flags no Beam PipelineOptions class defines (Beam itself would drop them silently)."""
    return [a for a in unparsed_beam_args(args) if a.startswith("-")]


def unparsed_beam_args(args: list[str]) -> list[str]:
    """What no Beam PipelineOptions class takes: unknown flags and stray values. Values may follow
    their flag in either form Beam reads (``--direct_num_workers=2`` or ``--direct_num_workers 2``)."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser
    parser = _BeamArgumentParser(allow_abbrev=False)
    seen: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 (how Beam itself collects its options)
    _, unknown = parser.parse_known_args(list(args))
    return unknown


def with_suggestions(flags: list[str]) -> str:
    """``--retreiver`` → ``--retreiver (did you mean --retriever?)``, from the flags specrag defines."""
    import difflib
    known = sorted({o for classes in JOB_OPTIONS.values() for cls in classes
                    for o in _option_strings(cls) if o.startswith("--") and "_" not in o})  # dashed spellings
    out = []
    for flag in flags:
        name = flag.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        out.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return ", ".join(out)


def foreign_flags(command: str, flags: list[str]) -> list[str]:
    """Flags of other specrag commands among ``flags`` (what ``command``'s own parser left over),
    each with the commands that take it: Beam would take them silently as pipeline options."""
    owners: dict[str, list[str]] = {}
    for name, classes in JOB_OPTIONS.items():
        for cls in classes:
            for o in _option_strings(cls):
                owners.setdefault(o, []).append(name)
    return [f"{f.split('=', 1)[0]} (an option of {', '.join(sorted(set(owners[f.split('=', 1)[0]])))})"
            for f in flags if f.split("=", 1)[0] in owners and command not in owners[f.split("=", 1)[0]]]


def _option_strings(cls) -> list[str]:
    parser = argparse.ArgumentParser(add_help=False)
    cls._add_argparse_args(parser)  # noqa: SLF001
    return [o for action in parser._actions for o in action.option_strings]  # noqa: SLF001


def beam_args_from_flags(flags: list[str]) -> tuple[str, ...]:
    """A job's flags (specrag's and Beam's), checked, with the default runner."""
    unknown = unknown_beam_flags(flags)
    if unknown:
        raise ValueError(f"unknown option(s) {with_suggestions(unknown)}: neither specrag nor Beam defines them "
                         "(see `specrag COMMAND --help`; Beam options are listed in its PipelineOptions)")
    if not any(a.startswith("--runner") for a in flags):
        flags = ["--runner=FnApiRunner", *flags]
    return tuple(worker_visible_paths(flags))


def job_options(flags: list[str]):
    """(PipelineOptions, Beam args) of a job's flags, checked (``beam_args_from_flags``)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    beam_args = beam_args_from_flags(flags)
    return PipelineOptions(list(beam_args)), beam_args
