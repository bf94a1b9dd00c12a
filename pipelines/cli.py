"""The `specrag` command: import-data, build-index, build-datastore, answer, evaluate, demo.

Arguments the command does not know are passed to Beam as pipeline options (for example
``--runner=PortableRunner --job_endpoint=...``); one that neither specrag nor any Beam
options class knows is an error. The default runner is the FnApiRunner.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights come from installed packages only
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def unknown_beam_flags(args: list[str]) -> list[str]:
    """Flags no Beam PipelineOptions class defines (Beam itself would drop them silently)."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser
    parser = _BeamArgumentParser(allow_abbrev=False)
    seen: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 (how Beam itself collects its options)
    _, unknown = parser.parse_known_args(list(args))
    return [a for a in unknown if a.startswith("-")]


def _beam_args(extra: list[str]) -> tuple[str, ...]:
    unknown = unknown_beam_flags(extra)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}: neither specrag nor Beam defines them "
                         "(see `specrag COMMAND --help`; Beam options are listed in its PipelineOptions)")
    if not any(a.startswith("--runner") for a in extra):
        extra = ["--runner=FnApiRunner", *extra]
    return tuple(extra)


def _runtime(args):
    from specrag.inference.engine import EngineConfig
    from specrag.transforms.runtime import RuntimeConfig
    models = dict(RuntimeConfig().models)
    for spec in args.model or []:
        role, _, name = spec.partition("=")
        models[role] = name
    triton = None
    if args.backend == "triton" or args.triton_url:
        from specrag.inference.triton import TritonConfig
        triton = TritonConfig(url=args.triton_url or TritonConfig().url, timeout_s=args.triton_timeout,
                              retries=args.triton_retries)
    return RuntimeConfig(backend=args.backend, models=tuple(sorted(models.items())),
                         index_dir=args.index, retriever=args.retriever, num_threads=args.threads, dtype=args.dtype,
                         engine=EngineConfig(max_batch=args.engine_batch, max_wait_s=args.engine_wait,
                                             max_in_flight=getattr(args, "max_in_flight", 64)),
                         triton=triton, datastore_dir=args.datastore, datastore_kind=args.datastore_kind)


def cmd_import_data(args, extra) -> int:
    from specrag.importers import FORMATS, import_datasets
    names = list(FORMATS) if args.datasets == "all" else args.datasets.split(",")
    summary = import_datasets(Path(args.data_dir), names, Path(args.out), pool=args.pool)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_build_index(args, extra) -> int:
    from specrag.pipelines.build_index import run_build_index
    kinds = args.kinds.split(",")
    dense_params = {k: {"shards": args.dense_shards} for k in kinds if k in ("dense", "hnsw", "ivf")}
    manifest = run_build_index(args.corpus, args.index, kinds, embedder=args.embedder,
                               num_threads=args.threads, beam_args=_beam_args(extra), dense_params=dense_params)
    print(json.dumps(manifest["index"], indent=2))
    return 0


def cmd_build_datastore(args, extra) -> int:
    from specrag.pipelines.build_datastore import run_build_datastore
    manifest = run_build_datastore(args.corpus, args.out, model=args.model, max_tokens=args.max_tokens,
                                   max_entries=args.max_entries, kinds=tuple(args.kinds.split(",")),
                                   num_threads=args.threads, dtype=args.dtype, beam_args=_beam_args(extra))
    print(json.dumps(manifest["datastore"], indent=2))
    return 0


def cmd_answer(args, extra) -> int:
    from specrag.methods import create_method
    from specrag.methods.base import parse_settings
    from specrag.pipelines.answer import AnswerJob, RunFailed, run_answer
    method = create_method(args.method, **parse_settings(args.method, args.set or []))
    runtime = _runtime(args).with_roles(method.model_roles)
    job = AnswerJob(args.queries, args.output, method, runtime, batch_size=args.batch_size,
                    num_shards=args.shards, beam_args=_beam_args(extra), resume=args.resume,
                    overwrite=args.overwrite, execution=args.execution,
                    max_failure_fraction=args.max_failure_fraction, gather_timeout_s=args.gather_timeout,
                    shard_rows=args.shard_rows, bad_files=args.bad_files)
    try:
        manifest = run_answer(job)
    except RunFailed as e:
        print(f"specrag answer: failed: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({manifest['wall_s']} s); manifest: {Path(args.output) / 'manifest.json'}")
    return 0


def cmd_evaluate(args, extra) -> int:
    from specrag.evaluation.report import evaluate_run, format_table, save_report
    from specrag.transforms.files import join
    rows = []
    for run in args.runs:
        report = evaluate_run(run, args.queries)
        rows.extend(report["rows"])
        save_report(report, join(run, "evaluation.json"))
        cov = report["coverage"]
        print(f"{run}: {cov['answered']} answered, {cov['dead_letter_ids']} dead letters, {cov['missing']} missing, "
              f"{cov['duplicate_results']} duplicate results, {cov['in_results_and_dead_letters']} in both "
              f"(of {cov['queries']} queries)")
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def cmd_demo(args, extra) -> int:
    from specrag.pipelines.demo import run_demo
    return run_demo(Path(args.workdir), threads=args.threads, beam_args=_beam_args(extra))


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="local", choices=("local", "triton"),
                   help="local: models in the worker process; triton: a Triton server (--triton-url)")
    p.add_argument("--triton-url", help="grpc://host:port (default grpc://127.0.0.1:8001) or http://host:port")
    p.add_argument("--triton-timeout", type=float, default=300.0, help="seconds per Triton request")
    p.add_argument("--triton-retries", type=int, default=3,
                   help="retries (exponential backoff) while the server is unavailable or overloaded")
    p.add_argument("--model", action="append", metavar="ROLE=NAME",
                   help="model for a role, e.g. generator=smollm2-135m-instruct")
    p.add_argument("--index", help="index folder from `specrag build-index`")
    p.add_argument("--datastore", help="KNN-LM datastore folder from `specrag build-datastore`")
    p.add_argument("--datastore-kind", default="flat", help="flat (exact) | hnsw")
    p.add_argument("--retriever", default="bm25", help="bm25 | lucene | dense (exact) | hnsw | ivf")
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")),
                   help="torch threads per worker")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 (faster on AMX CPUs, not bit-equal)")
    p.add_argument("--engine-batch", type=int, default=16, help="max requests per batched model call")
    p.add_argument("--engine-wait", type=float, default=0.005, help="max seconds a request waits for a batch")


class _Parser(argparse.ArgumentParser):
    """Builds an expensive epilog (every method's settings) only when help is shown."""

    epilog_fn = None

    def format_help(self) -> str:
        if self.epilog_fn is not None and self.epilog is None:
            self.epilog = self.epilog_fn()
        return super().format_help()


def _methods_epilog() -> str:
    from specrag.methods.base import describe_methods
    return describe_methods()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specrag", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("import-data", help="native benchmark formats → queries/corpus Parquet")
    p.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    p.add_argument("--datasets", default="all", help="comma-separated names, or all")
    p.add_argument("--out", required=True)
    p.add_argument("--pool", action="store_true", help="also write one deduplicated pooled corpus")
    p.set_defaults(fn=cmd_import_data)

    p = sub.add_parser("build-index", help="corpus Parquet → index folder (Beam job)")
    p.add_argument("--corpus", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--kinds", default="bm25", help="comma-separated: bm25,lucene,dense,hnsw,ivf")
    p.add_argument("--embedder", default="all-minilm-l6-v2")
    p.add_argument("--dense-shards", type=int, default=1,
                   help="FAISS indexes in N row-range shards; search merges their top-k")
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    p.set_defaults(fn=cmd_build_index)

    p = sub.add_parser("build-datastore", help="corpus Parquet → KNN-LM datastore (Beam job)")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per passage")
    p.add_argument("--max-entries", type=int, default=None, help="keep the first N entries in corpus order")
    p.add_argument("--kinds", default="flat,hnsw")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    p.set_defaults(fn=cmd_build_datastore)

    p = sub.add_parser("answer", help="answer a query table with a RAG method (Beam job)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.epilog_fn = _methods_epilog
    p.add_argument("--queries", required=True, help="Parquet file or glob")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--method", default="standard", help="a registered method (listed below)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="method setting, parsed to the setting's type, e.g. top_k=5")
    p.add_argument("--max-in-flight", type=int, default=64,
                   help="queries running at once in one worker's engine (backpressure beyond)")
    p.add_argument("--execution", default="streaming", choices=("streaming", "fixed-batch"),
                   help="streaming: queries enter the per-worker engine as they arrive; "
                        "fixed-batch: the earlier batch-at-a-time execution (for comparisons)")
    p.add_argument("--batch-size", type=int, default=16, help="queries per batch (fixed-batch execution)")
    p.add_argument("--shards", type=int, default=4, help="shard keys for keyed batching (fixed-batch execution)")
    p.add_argument("--overwrite", action="store_true", help="replace the results already in --output")
    p.add_argument("--shard-rows", type=int, default=1000,
                   help="results are written in Parquet shards of this many rows as queries finish "
                        "(what a killed run keeps for --resume)")
    p.add_argument("--bad-files", default="fail", choices=("fail", "dead-letter"),
                   help="an unreadable input Parquet file stops the job at start (fail) or becomes one "
                        "dead letter naming it while the other files are answered")
    p.add_argument("--max-failure-fraction", type=float, default=0.5,
                   help="exit non-zero (after writing everything) when a larger share of queries fails")
    p.add_argument("--gather-timeout", type=float, default=None,
                   help="seconds a fanned-out query waits for all its parts before going to dead letters "
                        "(streaming; in batch runs the end of input expires incomplete queries)")
    p.add_argument("--resume", action="store_true",
                   help="keep earlier results in --output and answer only the queries without one")
    _add_runtime(p)
    p.set_defaults(fn=cmd_answer)

    p = sub.add_parser("evaluate", help="score one or more answer runs against gold queries")
    p.add_argument("runs", nargs="+", help="output folders of `specrag answer`")
    p.add_argument("--queries", required=True, help="gold queries Parquet (file or glob)")
    p.add_argument("--json", help="also write the table rows here")
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("demo", help="build the demo index, answer the demo questions, print metrics")
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    p.set_defaults(fn=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Beam warns on import about GCP clients that batch runs on local files never use
    logging.getLogger().addFilter(lambda r: "apitools not found" not in r.getMessage())
    args, extra = parser().parse_known_args(argv)
    unknown = [a for a in extra if not a.startswith("--")]
    if unknown:
        parser().error(f"unexpected arguments: {unknown}")
    try:
        return args.fn(args, extra)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as e:
        print(f"specrag {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
