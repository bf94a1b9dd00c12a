"""The `specrag` command: import-data, build-index, build-datastore, extract-triplets, label-utility,
train-utility, train-denoiser, synthesize-rationales, train-drafter, answer, evaluate, compare, demo.

The Beam jobs (answer, build-index, build-datastore, extract-triplets) take their flags from PipelineOptions
classes (pipelines/options.py): the same definitions make the CLI, ``--help`` and the
options that travel with the job. Beam's own flags pass through (for example
``--runner=PortableRunner --job_endpoint=...``); a flag that neither specrag nor any Beam
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



def _quiet_beam_import(record: logging.LogRecord) -> bool:
    """Beam warns on import about GCP clients that batch runs on local files never use."""
    return "apitools not found" not in record.getMessage()


logging.getLogger().addFilter(_quiet_beam_import)  # before Beam is imported (the command's own module)
from specrag.wording import count  # noqa: E402
from specrag.pipelines.options import (beam_args_from_flags, foreign_flags, job_options, unparsed_beam_args,  # noqa: E402
                                       with_suggestions)


def cmd_import_data(args, extra) -> int:
    from specrag.importers import FORMATS, import_datasets
    names = list(FORMATS) if args.datasets == "all" else args.datasets.split(",")
    summary = import_datasets(Path(args.data_dir), names, Path(args.out), pool=args.pool, limit=args.limit)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_build_index(args, flags) -> int:
    from specrag.pipelines.build_index import run_build_index
    from specrag.retrieval.index import DENSE_KINDS
    from specrag.pipelines.options import BuildIndexOptions, CorpusOptions, KindsOptions, ReplaceOptions, RuntimeOptions
    options, beam_args = job_options(flags)
    options.view_as(BuildIndexOptions).validate()
    options.view_as(ReplaceOptions).validate()
    corpus, runtime = options.view_as(CorpusOptions), options.view_as(RuntimeOptions)
    kinds = (options.view_as(KindsOptions).kinds or "bm25").split(",")
    embedder = runtime.models_by_role({"embedder": "all-minilm-l6-v2"}, ("embedder",), "build-index")["embedder"]
    shards = options.view_as(BuildIndexOptions).dense_shards
    dense_params = {k: {"shards": shards} for k in kinds if k in DENSE_KINDS}
    config = runtime.runtime_config()
    manifest = run_build_index(corpus.corpus, runtime.index, kinds, embedder=embedder, num_threads=runtime.threads,
                               beam_args=beam_args, dense_params=dense_params, backend=config.backend_for(embedder),
                               backend_configs=config.backend_configs,
                               embeddings=options.view_as(BuildIndexOptions).embeddings, **_replace(options))
    if "template" in manifest:
        print(_template_line(manifest))
        return 0
    print(json.dumps(manifest["index"], indent=2))
    return 0


def _template_line(manifest: dict) -> str:
    return (f"wrote the Dataflow template of this {manifest['job']} job: {manifest['template']} (nothing ran; the "
            "pipeline it describes is staged under --staging_location)")


def _replace(options) -> dict:
    """--overwrite and --max-failure-fraction, as the build jobs take them."""
    from specrag.pipelines.options import ReplaceOptions
    r = options.view_as(ReplaceOptions)
    return {"overwrite": r.overwrite, "max_failure_fraction": r.max_failure_fraction}


def cmd_build_datastore(args, flags) -> int:
    from specrag.inference.processor import resolve_dtype
    from specrag.pipelines.build_datastore import run_build_datastore
    from specrag.pipelines.options import (BuildDatastoreOptions, CorpusOptions, KindsOptions, ReplaceOptions,
                                           RuntimeOptions)
    options, beam_args = job_options(flags)
    job = options.view_as(BuildDatastoreOptions)
    job.validate()
    options.view_as(ReplaceOptions).validate()
    corpus, runtime = options.view_as(CorpusOptions), options.view_as(RuntimeOptions)
    from specrag import registry
    if not registry.BACKENDS[runtime.runtime_config().backend].in_process:  # --backend or a --*-url that names one
        raise ValueError("build-datastore reads hidden states of the model: it runs on the local backend")
    model = runtime.models_by_role({"generator": "smollm2-135m-instruct"}, ("generator",),
                                   "build-datastore")["generator"]
    manifest = run_build_datastore(corpus.corpus, runtime.datastore, model=model, max_tokens=job.max_tokens,
                                   max_entries=job.max_entries, kinds=tuple((options.view_as(KindsOptions).kinds or "flat,hnsw").split(",")),
                                   num_threads=runtime.threads, dtype=resolve_dtype(runtime.dtype), beam_args=beam_args,
                                   **_replace(options))
    print(json.dumps(manifest["datastore"], indent=2))
    return 0


def _run_answer_flags(flags, command: str, method_name: str | None = None):
    """Run the answer job of these flags; returns (manifest, output folder). A run over its
    failure threshold raises RunFailed, which ``main`` turns into exit status 1."""
    from specrag.pipelines.answer import answer_job_from_flags, run_answer
    job = answer_job_from_flags(flags, command, method_name)
    return run_answer(job), job.output


def cmd_answer(args, flags) -> int:
    manifest, out = _run_answer_flags(flags, "answer")
    from specrag.jobio.run_folder import reconciliation_line
    if "template" in manifest:
        print(_template_line(manifest))
        return 0
    print(f"wrote {out} ({manifest['wall_s']} s); manifest: {out.rstrip('/')}/manifest.json")
    if manifest.get("mode") == "streaming":
        account = manifest["account"]
        print(f"stream stopped: {count(account['results'], 'id')} answered, "
              f"{count(account['dead_letters'], 'dead letter')}, {count(len(manifest['windows']), 'window')}")
    else:
        print(f"reconciliation: {reconciliation_line(manifest['reconciliation'])}")
    return 0


def cmd_label_utility(args, flags) -> int:
    from specrag.pipelines.utility import write_labels
    manifest, out = _run_answer_flags(flags, "label-utility", method_name="aed-label")
    summary = write_labels(out)
    print(f"{summary['questions']} questions, {summary['units']} labelled units in {manifest['wall_s']} s; "
          f"wrote {summary['labels']}")
    return 0


def cmd_synthesize_rationales(args, flags) -> int:
    from specrag.pipelines.answer import answer_job_from_flags, run_answer
    from specrag.pipelines.drafter import write_rationales
    job = answer_job_from_flags(flags, "synthesize-rationales", "rationale-synthesis")
    manifest = run_answer(job)
    summary = write_rationales(job.output, job.queries, job.runtime.index_dir)
    print(f"{summary['questions']} questions: {summary['kept']} rationales kept, {summary['filtered']} filtered "
          f"({', '.join(f'{k} {v}' for k, v in summary['by_reason'].items() if k != 'kept') or 'none'}) in "
          f"{manifest['wall_s']} s; wrote {summary['rationales']}")
    return 0


def cmd_train_drafter(args, extra) -> int:
    from specrag.training.drafter import DrafterTrainingConfig
    from specrag.pipelines.drafter import run_train_drafter
    from specrag.pipelines.training_inputs import TrainingInputFailed
    from specrag.training.state import TrainingStopped
    config = DrafterTrainingConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
                                   max_tokens=args.max_tokens, held_out=args.held_out,
                                   checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads,
                                   lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
                                   option_orders=args.option_orders, compute_dtype=args.compute_dtype,
                                   micro_batch=args.micro_batch, patience=args.patience)
    try:
        report = run_train_drafter(args.rationales, args.output, config, base=args.base, overwrite=args.overwrite,
                                   resume=args.resume, max_failure_fraction=args.max_failure_fraction,
                                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    except TrainingInputFailed as e:
        print(f"specrag train-drafter: failed: {e}", file=sys.stderr)
        return 1
    except TrainingStopped as e:
        print(f"specrag train-drafter: {e}", file=sys.stderr)
        return 130
    print(json.dumps({k: report[k] for k in ("cached", "examples", "held_out_examples", "too_long", "epoch_loss",
                                             "held_out_loss_untrained", "held_out_loss_trained", "best_step",
                                             "dead_letters", "wall_s")}))
    print(f"{'reused' if report['cached'] else 'saved'} the drafter in {args.output} "
          f"(use --method speculative-rag --model drafter={args.output})")
    return 0


def cmd_train_utility(args, extra) -> int:
    from specrag.pipelines.utility import run_train_utility
    from specrag.training.utility_predictor import UtilityTrainingConfig
    config = UtilityTrainingConfig(epochs=args.epochs, learning_rate=args.learning_rate,
                                   head_learning_rate=args.head_learning_rate,
                                   batch_queries=args.batch_queries, max_units=args.max_units,
                                   max_length=args.max_length, held_out=args.held_out, seed=args.seed,
                                   threads=args.threads)
    from specrag.pipelines.training_inputs import TrainingInputFailed
    try:
        report = run_train_utility(args.labels, args.output, config, threads=args.threads, overwrite=args.overwrite,
                                   resume=args.resume, max_failure_fraction=args.max_failure_fraction, base=args.base)
    except TrainingInputFailed as e:
        print(f"specrag train-utility: failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: report[k] for k in ("questions", "dropped_useless", "train_questions",
                                             "held_out_questions", "steps", "epoch_loss", "wall_s")}))
    print(f"held-out ranking agreement with the CPPL teacher (mean Spearman): trained "
          f"{report['spearman_trained']:.3f}, before training {report['spearman_initial']:.3f}, "
          f"untrained MiniLM similarity {report['spearman_untrained']:.3f}")
    print(f"saved the utility predictor to {args.output} (use --model utility={args.output})")
    return 0


def cmd_train_denoiser(args, extra) -> int:
    from specrag.training.denoiser import DenoiserTrainingConfig, adapts_ar_model
    from specrag.pipelines.denoiser import run_train_denoiser
    config = DenoiserTrainingConfig(corpus_steps=args.corpus_steps, trace_epochs=args.trace_epochs,
                                    batch_size=args.batch_size, learning_rate=args.learning_rate,
                                    head_learning_rate=args.head_learning_rate,
                                    response_tokens=args.response_tokens, held_out=args.held_out, seed=args.seed,
                                    threads=args.threads, max_positions=args.max_positions or
                                    (1024 if adapts_ar_model(args.base) else 512),
                                    checkpoint_every=args.checkpoint_every, patience=args.patience,
                                    stop_at_step=args.stop_at_step)
    from specrag.pipelines.training_inputs import TrainingInputFailed
    try:
        report = run_train_denoiser(args.queries, args.index, args.output, config, split=args.split, top_k=args.top_k,
                                    passage_words=args.passage_words, max_passages=args.max_passages,
                                    overwrite=args.overwrite, resume=args.resume,
                                    max_failure_fraction=args.max_failure_fraction,
                                    base=args.base, progress=lambda line: print(line, file=sys.stderr, flush=True),
                                    step_words=args.step_words, probe_questions=args.probe_questions)
    except TrainingInputFailed as e:
        print(f"specrag train-denoiser: failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({k: report[k] for k in ("corpus_passages", "trace_examples", "held_out_examples",
                                             "trace_epoch_loss", "truncated_contexts", "best_step", "stopped_early",
                                             "resumed_at", "wall_s")}))
    print("held-out masked-word accuracy by mask ratio: untrained head "
          f"{report['accuracy_untrained']}, after the corpus stage {report['accuracy_after_corpus']}, "
          f"trained {report['accuracy_trained']}")
    print(f"saved the denoiser to {args.output} (use --model denoiser={args.output} --method sardi "
          f"--set max_new_tokens={args.response_tokens} --set passage_words={args.passage_words})")
    return 0


def cmd_extract_triplets(args, flags) -> int:
    from specrag.pipelines.extract_triplets import ExtractJob, run_extract_triplets
    from specrag.pipelines.options import (CorpusOptions, ExtractTripletsOptions, OutputOptions, ReplaceOptions,
                                           RuntimeOptions)
    from specrag.transforms.triplets import ExtractorConfig
    options, beam_args = job_options(flags)
    x, o, r = options.view_as(ExtractTripletsOptions), options.view_as(OutputOptions), options.view_as(ReplaceOptions)
    x.validate()
    r.validate()
    runtime = options.view_as(RuntimeOptions)
    roles = ("generator",) if x.extractor == "generator" else ()
    model = runtime.models_by_role({}, roles, f"extract-triplets --extractor {x.extractor}").get("generator")
    remote = runtime.runtime_config()
    config = ExtractorConfig(extractor=x.extractor, backend=runtime.backend, model=model, max_chars=x.max_chars,
                             resolve_title_pronouns=not x.keep_pronouns, max_new_tokens=x.max_new_tokens_triplets,
                             num_threads=runtime.threads, backend_configs=remote.backend_configs)
    job = ExtractJob(options.view_as(CorpusOptions).corpus, o.output, config, beam_args=beam_args,
                     batch_size=x.extract_batch, shard_passages=x.shard_passages, resume=o.resume,
                     overwrite=r.overwrite, bad_files=o.bad_files, max_failure_fraction=r.max_failure_fraction)
    manifest = run_extract_triplets(job)
    print(f"{count(manifest['passages'], 'passage')}, {count(manifest['triplets'], 'triplet')}, "
          f"{count(manifest['dead_letters'], 'dead letter')} in {manifest['wall_s']} s "
          f"({manifest['passages_per_s']} passages/s); wrote {o.output}")
    return 0


def cmd_evaluate(args, extra) -> int:
    from specrag.evaluation.report import evaluate_run, format_table, save_report
    from specrag.jobio.files import join
    from specrag.jobio.run_folder import EVALUATION_FILE
    rows = []
    for run in args.runs:
        report = evaluate_run(run, args.queries)
        rows.extend(report["rows"])
        save_report(report, join(run, EVALUATION_FILE))
        cov = report["coverage"]
        print(f"{run}: {cov['answered']} answered, {count(cov['dead_letter_ids'], 'dead letter')}, {cov['missing']} missing, "
              f"{cov['duplicate_results']} duplicate results, {cov['in_results_and_dead_letters']} in both "
              f"(of {cov['queries']} queries)")
        if cov["duplicate_results"]:
            print(f"{run}: {cov['duplicate_results']} duplicate results ignored (the first result of each id counts)")
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def cmd_compare(args, extra) -> int:
    from specrag.pipelines.compare import run_compare
    workdir = args.workdir or f"runs/compare/{Path(args.suite).stem}"
    split = lambda v: tuple(x.strip() for x in (v or "").split(",") if x.strip())  # noqa: E731
    outcome = run_compare(args.suite, workdir, args.report_dir, check=args.check, extra_flags=list(extra),
                          limit=args.limit, methods=split(args.methods), datasets=split(args.datasets),
                          runs_dir=args.runs_dir, report_only=args.report_only, reuse_from=tuple(args.reuse_from))
    print(Path(outcome.files["markdown"]).read_text())
    print(f"report: {outcome.files['html']} (HTML), {outcome.files['markdown']} (Markdown)")
    failed_jobs = [r for r in outcome.records if r.status == "failed"]
    if args.check:
        if outcome.failed_expectations:
            print("specrag compare --check: FAILED\n  " + "\n  ".join(outcome.failed_expectations), file=sys.stderr)
            return 1
        print(f"specrag compare --check: all {len(outcome.report['expectations'])} expectations hold")
    return 1 if failed_jobs else 0


def cmd_demo(args, extra) -> int:
    from specrag.pipelines.demo import run_demo
    return run_demo(Path(args.workdir), threads=args.threads, beam_args=beam_args_from_flags(extra))


def _add_job_options(p: argparse.ArgumentParser, command: str) -> None:
    """The job's PipelineOptions classes' flags, for --help and for finding unknown flags."""
    from specrag.pipelines.options import JOB_OPTIONS
    for cls in JOB_OPTIONS[command]:
        cls._add_argparse_args(p)  # noqa: SLF001 (the way Beam collects an options class's flags)


def _add_training_output_options(p: argparse.ArgumentParser) -> None:
    """The Beam jobs' rules for earlier output and failed rows (ReplaceOptions), for a training command."""
    p.add_argument("--overwrite", action="store_true",
                   help="replace the model already in --output (refused without it; it comes back if training fails)")
    p.add_argument("--resume", action="store_true",
                   help="continue a killed run from its checkpoint (OUTPUT.partial; refused without it)")
    p.add_argument("--max-failure-fraction", type=float, default=0.5,
                   help="fail before training when a larger share of the input rows cannot be used "
                        "(they are written to OUTPUT/dead_letters.parquet either way)")


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

    from specrag.importers import FORMATS
    p = sub.add_parser("import-data", help="native benchmark formats → queries/corpus Parquet")
    p.add_argument("--data-dir", default=os.environ.get("SPECRAG_DATA", "../shared/data"))
    p.add_argument("--datasets", default="all", help=f"comma-separated names, or all: {', '.join(FORMATS)}")
    p.add_argument("--limit", type=int, default=0, help="only the first N questions of each set, and their "
                                                        "passages (default: all)")
    p.add_argument("--out", required=True)
    p.add_argument("--pool", action="store_true", help="also write one deduplicated pooled corpus")
    p.set_defaults(fn=cmd_import_data)

    p = sub.add_parser("build-index", help="corpus Parquet → index folder (Beam job)",
                       description="Embeds with --model embedder=NAME (dense kinds) on --backend.")
    _add_job_options(p, "build-index")
    p.set_defaults(fn=cmd_build_index)

    p = sub.add_parser("build-datastore", help="corpus Parquet → KNN-LM datastore (Beam job)",
                       description="Hidden states of --model generator=NAME (local backend) into --datastore.")
    _add_job_options(p, "build-datastore")
    p.set_defaults(fn=cmd_build_datastore)

    p = sub.add_parser("extract-triplets", help="corpus Parquet → knowledge triplets Parquet (Beam job)",
                       description="Triplets (head; relation; tail) of every passage, for AED-RAG and on their own.")
    _add_job_options(p, "extract-triplets")
    p.set_defaults(fn=cmd_extract_triplets)

    p = sub.add_parser("label-utility", help="CPPL labels of AED-RAG's candidate units for training questions "
                                             "(Beam job: the answer job with method aed-label)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_job_options(p, "answer")
    p.set_defaults(fn=cmd_label_utility)

    p = sub.add_parser("synthesize-rationales", help="rationales for Speculative RAG's drafter: a teacher model "
                                                     "explains each training question's gold answer from a document "
                                                     "subset (Beam job: the answer job with method rationale-synthesis)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_job_options(p, "answer")
    p.set_defaults(fn=cmd_synthesize_rationales)

    p = sub.add_parser("train-drafter", help="instruction-tune Speculative RAG's drafter on synthesize-rationales' output")
    p.add_argument("--rationales", required=True, help="synthesize-rationales output folder, rationales Parquet or glob")
    p.add_argument("--output", required=True, help="model folder to write (then --model drafter=FOLDER)")
    p.add_argument("--base", default="smollm2-135m-instruct", help="the causal LM to tune (any model spec)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--max-tokens", type=int, default=1024, help="prompt + response; longer examples are left out")
    p.add_argument("--held-out", type=float, default=0.05, help="share of examples kept back for the loss check")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (0: at the end only); the one with the lowest held-out loss is "
                        "kept, and --resume continues a killed run from OUTPUT.partial")
    p.add_argument("--patience", type=int, default=0,
                   help="stop once this many checkpoints in a row have not lowered the held-out loss (0: train "
                        "every epoch); the best checkpoint is saved either way, and a run resumed with it stops too")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train a LoRA adapter of this rank on the base's linear layers instead of every weight "
                        "(0: full fine-tuning); the folder then holds the adapter, loaded merged over --base")
    p.add_argument("--lora-alpha", type=int, default=16, help="the adapter's scale is alpha / rank")
    p.add_argument("--option-orders", type=int, default=0,
                   help="teach each multiple-choice example in this many orders of its options, the gold option "
                        "at a different letter in each, so the drafter learns the choice, not a letter (0: as given)")
    p.add_argument("--micro-batch", type=int, default=0,
                   help="examples per forward pass, gradients accumulated to --batch-size (0: the whole batch): "
                        "the same step in less memory")
    p.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the matmuls' dtype while training (weights and optimizer stay float32): bfloat16 is faster "
                        "on processors with AVX512-BF16 or AMX, slower elsewhere")
    _add_training_output_options(p)
    p.set_defaults(fn=cmd_train_drafter)

    p = sub.add_parser("train-utility", help="train AED-RAG's utility predictor from label-utility's labels")
    p.add_argument("--labels", required=True, help="label-utility output folder, labels Parquet file or glob")
    p.add_argument("--output", required=True, help="model folder to write (then --model utility=FOLDER)")
    p.add_argument("--base", default="all-minilm-l6-v2",
                   help="what the predictor starts from: an encoder (a new one-logit head) or a cross-encoder "
                        "reranker such as ms-marco-minilm-l12-v2 (its own head; the paper: BGE-reranker-base)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--learning-rate", type=float, default=6e-5, help="the encoder's (paper: 6e-5)")
    p.add_argument("--head-learning-rate", type=float, default=1e-3, help="a new one-logit head's (an encoder base)")
    p.add_argument("--batch-queries", type=int, default=8, help="questions per optimisation step (paper: 8)")
    p.add_argument("--max-units", type=int, default=32, help="units per question, lowest CPPL first (paper: 32)")
    p.add_argument("--max-length", type=int, default=256, help="tokens per (question, unit) pair")
    p.add_argument("--held-out", type=float, default=0.1, help="share of questions kept back for the ranking check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    _add_training_output_options(p)
    p.set_defaults(fn=cmd_train_utility)

    p = sub.add_parser("train-denoiser", help="train SARDI's masked-diffusion denoiser (a causal LM adapted, or MiniLM + an MLM head) "
                                              "on corpus passages, then answer traces of a training split")
    p.add_argument("--queries", required=True, help="imported queries Parquet (file or glob): the split's questions "
                                                    "with gold passages are used")
    p.add_argument("--index", required=True, help="index folder (bm25) over a corpus holding the gold passages")
    p.add_argument("--output", required=True, help="model folder to write (then --model denoiser=FOLDER)")
    p.add_argument("--split", default="aed_train", help="training split (evaluation/splits/NAME.txt)")
    p.add_argument("--base", default="smollm2-135m-instruct",
                   help="the model to start from: a causal LM (the default; adapted into a masked-diffusion LM as "
                        "Dream-7B was) or an encoder (all-minilm-l6-v2, the test suite's small denoiser: an MLM head is "
                        "added)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="the denoiser's window (context + response): default 1024 for a causal LM, 512 for MiniLM")
    p.add_argument("--corpus-steps", type=int, default=30, help="stage 1 steps on corpus passages")
    p.add_argument("--trace-epochs", type=int, default=2, help="stage 2 passes over the traces (at most: see --patience)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--head-learning-rate", type=float, default=5e-4, help="the encoder base's new MLM head's")
    p.add_argument("--response-tokens", type=int, default=100,
                   help="the response window (sardi's max_new_tokens; the paper's 100)")
    p.add_argument("--step-words", type=int, default=0, help="cap each trace step at this many words (0: none; the "
                                                             "window's limit applies either way)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="trace-stage steps between checkpoints (0: at the end only); each is measured, written to "
                        "OUTPUT.partial (--resume continues a killed run from it), and the best is kept")
    p.add_argument("--patience", type=int, default=0, help="stop after this many checkpoints without a better score")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="train the trace stage to this step and keep it, no checkpoint or probe before it: replays a "
                        "recorded run's kept step (its training manifest's best_step) in a fraction of its time; "
                        "takes no --checkpoint-every or --patience")
    p.add_argument("--probe-questions", type=int, default=20,
                   help="held-out questions answered (DLM static) at each checkpoint; their F1 picks the best (0: the "
                        "held-out masked-word accuracy does)")
    p.add_argument("--top-k", type=int, default=7, help="evidence passages per trace (sardi's top_k)")
    p.add_argument("--passage-words", type=int, default=40, help="words per evidence passage: 7 of them, the "
                                                                  "question and the window fit in 512 positions")
    p.add_argument("--max-passages", type=int, default=0, help="corpus passages for stage 1 (0: all)")
    p.add_argument("--held-out", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    _add_training_output_options(p)
    p.set_defaults(fn=cmd_train_denoiser)

    p = sub.add_parser("answer", help="answer a query table with a RAG method (Beam job)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.epilog_fn = _methods_epilog
    _add_job_options(p, "answer")
    p.set_defaults(fn=cmd_answer)

    p = sub.add_parser("evaluate", help="score one or more answer runs against gold queries")
    p.add_argument("runs", nargs="+", help="output folders of `specrag answer`")
    p.add_argument("--queries", required=True, help="gold queries Parquet (file or glob)")
    p.add_argument("--json", help="also write the table rows here")
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("compare", help="run every method x dataset of a suite and report quality and cost "
                                       "side by side (HTML + Markdown)")
    p.add_argument("--suite", required=True, help="suite YAML (see benchmarks/suites/)")
    p.add_argument("--workdir", default=None, help="runs, data and indexes (default: runs/compare/SUITE)")
    p.add_argument("--report-dir", default=None, help="where the report goes (default: the workdir)")
    p.add_argument("--runs-dir", default=None, help="where the answer jobs write (default: WORKDIR/runs); "
                                                    "finished and partial runs there are reused and resumed")
    p.add_argument("--reuse-from", action="append", default=[], metavar="RUNS_DIR",
                   help="another suite's runs folder (repeatable): a finished run there with the same run identity "
                        "and input contents is copied here instead of run again")
    p.add_argument("--report-only", action="store_true", help="start no job: report the finished runs in the "
                                                              "runs folder as their manifests record them")
    p.add_argument("--check", action="store_true", help="fail when a result is outside the suite's expectations")
    p.add_argument("--limit", type=int, default=0, help="at most N questions per dataset (a quick look; "
                                                        "expectations then do not apply)")
    p.add_argument("--methods", default="", help="comma-separated method labels to run (their baselines too)")
    p.add_argument("--datasets", default="", help="comma-separated dataset names to run")
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("demo", help="compare the methods on the bundled demo data: table + HTML report")
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--threads", type=int, default=int(os.environ.get("SPECRAG_THREADS", "1")))
    p.set_defaults(fn=cmd_demo)
    return ap


def _filesystem_options(flags: list[str], paths: list[str]) -> None:
    """Beam's filesystems get the command's options (S3 endpoint and credentials, GCP project)
    before any path is touched: paths are checked on the launcher before a pipeline exists.
    The S3 buckets among the command's paths are checked once, fast."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions
    from specrag.jobio.files import check_buckets
    options = PipelineOptions(list(flags))
    FileSystems.set_options(options)
    check_buckets(paths, options)


def main(argv: list[str] | None = None) -> int:
    """``specrag COMMAND ...``; ``--verbose`` anywhere brings back the libraries' INFO logging
    (a successful run otherwise prints its progress lines and result only)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not verbose:  # Ctrl-C is said in one line below, not as the DoFn's traceback Beam logs
        logging.getLogger("apache_beam.runners.common").addFilter(
            lambda record: not (record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt)))
    args, extra = parser().parse_known_args(argv)
    foreign = foreign_flags("answer" if args.command == "compare" else args.command, extra)  # compare runs answer jobs
    if foreign:  # `extract-triplets --kinds`: another command's option, which the job would ignore
        parser().error(f"specrag {args.command} does not take {', '.join(foreign)}")
    left = unparsed_beam_args(extra)  # Beam's own flags pass, in both of its forms
    stray = [a for a in left if not a.startswith("-")]
    if stray:  # `--retreiver dense`: the stray value belongs to a flag nobody defines; name the flag
        flags = [a for a in left if a.startswith("-")]
        parser().error(f"unknown option(s) {with_suggestions(flags)}" if flags else f"unexpected arguments: {stray}")
    # a Beam job gets all its flags (specrag's and Beam's): they travel with its pipeline options
    flags = argv[argv.index(args.command) + 1:] if args.fn in (cmd_answer, cmd_build_index, cmd_build_datastore,
                                                               cmd_extract_triplets, cmd_label_utility,
                                                               cmd_synthesize_rationales) else extra
    from specrag.jobio.run_folder import RunFailed
    try:
        _filesystem_options(flags, [a.split("=", 1)[-1] for a in argv])
        return args.fn(args, flags)
    except RunFailed as e:  # everything was written; too many inputs failed (or some were lost)
        print(f"specrag {args.command}: failed: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, RuntimeError) as e:  # the run folder's transaction has ended (lease released)
        from specrag.transforms.progress import is_interrupt
        if not is_interrupt(e):
            raise
        from specrag.inference.engine import close_engines
        close_engines()  # else the exit waits for every queued model call
        print(f"specrag {args.command}: interrupted; what was written stays (--resume continues the run)",
              file=sys.stderr)
        return 130
    except (ValueError, OSError, KeyError, TypeError) as e:
        print(f"specrag {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
