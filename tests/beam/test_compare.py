"""`specrag compare`: suites, the statistics, the report and a real comparison on the demo data."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specrag.evaluation.compare_report import job_throughput, pareto_svg, render_html, render_markdown
from specrag.evaluation.stats import paired_bootstrap_ci, pareto_front
from specrag.pipelines.compare import check_expectations, reusable_elsewhere, run_compare
from specrag.pipelines.suite import load_suite, slug

REPO = Path(__file__).resolve().parents[2]


def _suite(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


GOOD = """
name: t
flags: {threads: 1, model: [generator=smollm2-135m-instruct], runner: FnApiRunner}
datasets:
  - {name: demo, queries: demo, index: {corpus: demo}, limit: 6, flags: {max_in_flight: 1}}
methods:
  - {label: no retrieval, method: no-retrieval}
  - label: standard RAG
    method: standard
    set: {top_k: 2}
    flags: {model: [generator=gemma3-270m], max_in_flight: 4}
    baselines: [no retrieval]
expect:
  - {dataset: demo, method: standard RAG, metric: contains, value: 50, tolerance: 50}
"""


def test_suite_loads_and_merges_flags_suite_then_dataset_then_method(tmp_path):
    suite = load_suite(_suite(tmp_path, GOOD))
    d, m = suite.datasets[0], suite.method("standard RAG")
    assert d.limit == 6 and d.corpus == "demo" and d.index is None
    flags = suite.job_flags(d, m)
    assert flags[:2] == ["--method", "standard"]
    pairs = list(zip(flags[2::2], flags[3::2]))
    # repeated flags append (the method's generator comes last, so it wins); single ones are replaced
    assert [v for k, v in pairs if k == "--model"] == ["generator=smollm2-135m-instruct", "generator=gemma3-270m"]
    assert [v for k, v in pairs if k == "--max_in_flight"] == ["4"] and ("--set", "top_k=2") in pairs
    assert slug("Standard RAG (verifier, 8x7B)") == "standard-rag-verifier-8x7b"


def test_a_narrowed_suite_keeps_the_named_methods_their_baselines_and_fewer_questions(tmp_path):
    suite = load_suite(_suite(tmp_path, GOOD))
    quick = suite.narrowed(limit=2, methods=("standard RAG",))
    assert [m.label for m in quick.methods] == ["no retrieval", "standard RAG"]  # the baseline comes along
    assert [(d.name, d.limit) for d in quick.datasets] == [("demo (first 2)", 2)] and not quick.expect
    assert suite.narrowed(limit=50).datasets == suite.datasets and suite.narrowed().expect == suite.expect
    assert [m.label for m in suite.narrowed(methods=("no retrieval",)).methods] == ["no retrieval"]
    with pytest.raises(ValueError, match="no method or dataset"):
        suite.narrowed(methods=("SARDI",))


def test_a_dataset_headline_overrides_the_suites(tmp_path):
    """PopQA is scored by containment in its papers, HotpotQA by EM/F1: one suite, both."""
    text = ("name: t\nheadline: {short_form: em}\ndatasets:\n  - {name: p, queries: q.parquet, headline: "
            "{short_form: contains}}\n  - {name: h, queries: q.parquet}\nmethods:\n  - {label: n, method: no-retrieval}\n")
    suite = load_suite(_suite(tmp_path, text))
    assert [suite.headline_for(d) for d in suite.datasets] == [{"short_form": "contains"}, {"short_form": "em"}]


def test_folder_flags_are_relative_to_the_suite_file(tmp_path):
    text = ("name: t\ndatasets:\n  - {name: d, queries: q.parquet, index: idx}\nmethods:\n"
            "  - {label: a, method: knnlm, flags: {datastore: ../ds, model: [generator=gemma3-270m, embedder=./e/m, "
            "scorer=org/name]}}\n")
    suite = load_suite(_suite(tmp_path, text))
    d = suite.datasets[0]
    assert (d.queries, d.index) == (str(tmp_path / "q.parquet"), str(tmp_path / "idx"))
    flags = suite.job_flags(d, suite.method("a"))
    assert flags[flags.index("--datastore") + 1] == str(tmp_path.parent / "ds")
    assert [flags[i + 1] for i, f in enumerate(flags) if f == "--model"] == [
        "generator=gemma3-270m", f"embedder={tmp_path / 'e' / 'm'}", "scorer=org/name"]  # a hub id stays


def test_suite_mistakes_are_reported_together_before_any_job(tmp_path):
    bad = """
name: t
flags: {output: x}
datasets:
  - {name: demo, queries: demo, limit: -1}
  - {name: demo, queries: demo, split: aed_test, headline: {long_form: em}}
methods:
  - {label: a, method: no-such-method}
  - {label: b, method: standard, set: {top_k: many}}
  - {label: c, method: standard, set: {no_such_setting: 1}, baselines: [zzz]}
  - {label: c, method: standard}
  - {label: "d, e", method: standard}
expect:
  - {dataset: demo, method: nobody, metric: em, value: 1, tolerance: 1}
  - {dataset: demo, method: c}
headline: {short_form: accuracy}
"""
    with pytest.raises(ValueError) as e:
        load_suite(_suite(tmp_path, bad))
    text = str(e.value)
    for needle in ("flags ['output'] are set by the suite", "limit must be", "unknown method 'no-such-method'",
                   "top_k expects an integer", "no setting 'no_such_setting'", "baseline 'zzz'",
                   "duplicate method labels ['c']", "unknown split 'aed_test'", "duplicate dataset names ['demo']", "method 'nobody'",
                   "needs dataset, method, metric, value and tolerance", "'accuracy' is not a metric",
                   "datasets[1]: headline: long_form: 'em' is not a metric",
                   "method labels ['d, e'] hold a comma"):
        assert needle in text, needle


def test_a_split_keeps_only_its_ids_then_the_limit_applies(tmp_path):
    """Held-out questions only (none a trained component saw), in file order, then the first N."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from specrag.evaluation.splits import load_split
    from specrag.pipelines.compare import prepare_dataset
    train, held = load_split("aed_train"), load_split("aed_eval")
    hot_train = [i for i in train if i.startswith("hotpotqa:")][:3]
    hot_held = [i for i in held if i.startswith("hotpotqa:")][:3]
    ids = [hot_train[0], hot_held[0], hot_train[1], hot_held[1], hot_held[2], hot_train[2]]
    pq.write_table(pa.table({"id": ids, "question": [f"q{i}" for i in range(6)]}), tmp_path / "q.parquet")
    suite = load_suite(_suite(tmp_path, "name: t\ndatasets:\n  - {name: h, queries: q.parquet, split: aed_eval, "
                                        "limit: 2}\nmethods:\n  - {label: n, method: no-retrieval}\n"))
    queries, index = prepare_dataset(suite.datasets[0], tmp_path / "work")
    assert index is None and pq.read_table(queries).column("id").to_pylist() == hot_held[:2]
    everything = load_suite(_suite(tmp_path, "name: t\ndatasets:\n  - {name: h, queries: q.parquet, split: "
                                             "aed_train}\nmethods:\n  - {label: n, method: no-retrieval}\n"))
    queries, _ = prepare_dataset(everything.datasets[0], tmp_path / "work")
    assert pq.read_table(queries).column("id").to_pylist() == [hot_train[0], hot_train[1], hot_train[2]]


def test_a_method_that_answers_none_of_a_datasets_task_types_is_not_run_there(tmp_path):
    """AED-RAG answers short-form questions only: on a multiple-choice set it is reported as not
    run (with the reason), not as a failed job, and the suite still passes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["Which?", "What?"],
                             "task_type": ["multiple_choice"] * 2, "choices": [["x", "y"], ["u", "v"]]}),
                   tmp_path / "mc.parquet")
    suite = _suite(tmp_path, "name: t\ndatasets:\n  - {name: mc, queries: mc.parquet}\nmethods:\n"
                             "  - {label: AED-RAG, method: aed-rag, set: {predictor: similarity}}\n")
    outcome = run_compare(suite, tmp_path / "work")
    [record] = outcome.records
    assert record.status == "not applicable" and "aed-rag answers short_form questions only" in record.error
    assert not (tmp_path / "work" / "runs").exists() and outcome.failed_expectations == []
    assert outcome.report["not_applicable"]["mc"] == [{"method": "AED-RAG", "reason": record.error}]
    assert "AED-RAG: not run (aed-rag answers short_form questions only; mc has multiple_choice)" in \
        Path(outcome.files["markdown"]).read_text()
    assert "AED-RAG: not run (aed-rag answers short_form" in Path(outcome.files["html"]).read_text()


def test_a_method_limited_to_some_datasets_runs_only_there_also_when_narrowed(tmp_path):
    text = ("name: t\ndatasets:\n  - {name: a, queries: q.parquet}\n  - {name: b, queries: q.parquet}\nmethods:\n"
            "  - {label: n, method: no-retrieval, datasets: [b]}\n")
    suite = load_suite(_suite(tmp_path, text))
    assert suite.method("n").datasets == ("b",)
    assert suite.narrowed(limit=3).method("n").datasets == ("b (first 3)",)
    assert [m.label for m in suite.narrowed(datasets=("a",)).methods] == []  # none of its datasets left
    with pytest.raises(ValueError, match=r"datasets \['c'\] are not datasets of the suite"):
        load_suite(_suite(tmp_path, text.replace("datasets: [b]", "datasets: [c]")))


def test_a_suite_whose_limit_grew_grows_its_runs_and_never_reports_the_smaller_one_as_done(tmp_path):
    """limit 2 → 4: the finished 2-question run is not "reused" as the 4-question one; it is grown
    (its 2 answers kept, 2 more answered); limit 3 after that is refused, not mixed in."""
    text = ("name: t\nflags: {runner: FnApiRunner}\ndatasets:\n  - {name: demo, queries: demo, index: {corpus: demo}, "
            "limit: LIMIT}\nmethods:\n  - {label: retrieval, method: retrieve-only, set: {top_k: 2}}\n")
    run = lambda limit: run_compare(_suite(tmp_path, text.replace("LIMIT", str(limit))), tmp_path / "work").records[0]  # noqa: E731
    assert run(2).status == "ran"
    out = tmp_path / "work" / "runs" / "demo" / "retrieval"
    two = (out / "manifest.json").read_text()
    grown = run(4)
    assert grown.status == "resumed" and grown.manifest["resumed"]["skipped_finished"] == 2
    assert grown.manifest["reconciliation"]["results"] == 4 and grown.manifest["counters"]["answered"] == 2
    assert grown.manifest["attempts"][-1]["grew_from"][0]["rows"] == 2
    assert run(4).status == "reused"
    # the growing attempt stopped before its first answer: inputs.json names the 4, the manifest the 2
    # (compare compacted the finished run into one file: keep only the first run's 2 answers)
    import pyarrow.parquet as pq
    [compacted] = out.glob("results-*.parquet")
    table = pq.read_table(compacted)
    first = set(table.column("id").to_pylist()[:2])  # the earlier attempt's rows come first
    compacted.unlink()
    pq.write_table(table.filter([i in first for i in table.column("id").to_pylist()]), out / "results-000-first.parquet")
    (out / "manifest.json").write_text(two)
    again = run(4)
    assert again.status == "resumed" and again.manifest["counters"]["answered"] == 2
    shrunk = run(3)
    assert shrunk.status == "failed" and "made from other input files" in shrunk.error


def test_report_only_starts_no_job_and_needs_no_model_of_an_earlier_sitting(tmp_path):
    """A suite longer than one sitting: the report is built from the runs made so far; a run not
    there yet is listed as not run, and a trained model that is not on this machine is not asked for."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), tmp_path / "q.parquet")
    suite = _suite(tmp_path, "name: t\ndatasets:\n  - {name: d, queries: q.parquet}\nmethods:\n"
                             "  - {label: AED-RAG, method: aed-rag, flags: {model: [utility=gone/predictor]}}\n")
    outcome = run_compare(suite, tmp_path / "work", runs_dir=tmp_path / "kept", report_only=True)
    [record] = outcome.records
    assert record.status == "not run" and record.error == f"no finished run in {tmp_path / 'kept' / 'd' / 'aed-rag'} yet"
    assert not (tmp_path / "kept").exists()  # nothing ran
    assert "AED-RAG: not run (no finished run in" in Path(outcome.files["markdown"]).read_text()


def test_pareto_front_keeps_what_nothing_beats_on_both():
    points = [(1.0, 10.0), (2.0, 30.0), (1.5, 5.0), (3.0, 30.0), (4.0, 40.0), (1.0, 10.0)]
    assert pareto_front(points) == [0, 1, 4]  # (1.5, 5) and (3, 30) are beaten; the tie keeps the first
    assert pareto_front([]) == []


def test_paired_bootstrap_interval():
    assert paired_bootstrap_ci([[1, 0, 1]], [[1, 0, 1]]) == (0.0, 0.0)
    a, b = [1] * 30 + [0] * 10, [0] * 40
    lo, hi = paired_bootstrap_ci([a], [b])
    assert lo < 75.0 < hi and lo > 50
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap_ci([[1, 0]], [[1]])


def _report(expect=()) -> dict:
    rows = {"no retrieval": {"method": "no retrieval", "n": 4, "contains": 25.0, "headline_metric": "contains",
                             "mean_latency_s": 0.5, "task_type": "short_form", "models": "generator=x"},
            "standard RAG": {"method": "standard RAG", "n": 4, "contains": 75.0, "headline_metric": "contains",
                             "mean_latency_s": 1.0, "task_type": "short_form", "models": "generator=x"}}
    return {"suite": {"name": "t", "description": "d", "path": "s.yaml"}, "generated": "now", "datasets": ["demo"],
            "rows": {"demo": rows},
            "baselines": {"demo": [{"method": "standard RAG", "baseline": "no retrieval", "metric": "contains",
                                    "n": 4, "difference": 50.0, "ci95": [0.0, 100.0], "same_answers": 1,
                                    "latency_ratio": 2.0, "speedup": 0.5}]},
            "pareto": {"demo": {"metric": "contains", "front": ["no retrieval", "standard RAG"],
                                "points": [{"method": k, "latency_s": r["mean_latency_s"], "quality": r["contains"]}
                                           for k, r in rows.items()]}},
            "examples": {"demo": {}}, "manifests": {"demo": {}}, "expectations": list(expect)}


def test_expectations_fail_outside_their_tolerance(tmp_path):
    suite = load_suite(_suite(tmp_path, GOOD))
    report = _report()
    report["rows"]["demo"]["standard RAG"]["contains"] = 100.0
    checked, failed = check_expectations(suite, report)
    assert checked[0]["ok"] and not failed
    report["rows"]["demo"]["standard RAG"]["contains"] = 100.5
    checked, failed = check_expectations(suite, report)
    assert not checked[0]["ok"] and "contains = 100.5 is outside 50.0 ± 50.0" in failed[0]
    del report["rows"]["demo"]["standard RAG"]["contains"]  # not measured: fails too
    assert check_expectations(suite, report)[1]


def test_report_renders_tables_front_and_plot_offline():
    report = _report()
    md = render_markdown(report)
    assert "| standard RAG | 4 |" in md and "Pareto front (contains against mean latency): no retrieval → standard RAG" in md
    assert "+50.00 | [+0.00, +100.00] | 1/4 | 2.000 | 0.500 |" in md
    report["baselines"]["demo"][0]["same_machine"] = False  # timed on different processors: said beside it
    assert "| 2.000 | 0.500 (different machines) |" in render_markdown(report)
    assert "0.500 (different machines)" in render_html(report)
    page = render_html(report)
    assert page.count("<svg") == 1 and page.count('class="on-front"') == 2 and page.count('<tr class="front"') == 2 and "pareto-front" in page
    # self-contained: no script, stylesheet, font or image from anywhere else
    assert "<script" not in page and "src=" not in page and "<link" not in page and "@import" not in page
    svg = pareto_svg([{"method": "a", "latency_s": 0.01, "quality": 10.0},
                      {"method": "b", "latency_s": 5.0, "quality": 50.0}], ["a", "b"], "em")
    assert "log scale" in svg and svg.count("<circle") == 2


def test_an_exact_methods_speed_up_is_shown_beside_its_retrieval_ceiling():
    """RaLMSpec gives RaLMSeq's answers, so it can only save RaLMSeq's retrieval time: 5% of the
    latency caps the speed-up at 1/0.95 = 1.053, and 1.026 is about half of that possible gain.
    Methods whose answers differ from their baseline's get no ceiling."""
    from specrag.evaluation.compare_report import retrieval_ceiling
    assert retrieval_ceiling(True, 0.05, 1.0, 1 / 1.026) == {"retrieval_share": 0.05, "ceiling": 1.053,
                                                            "share_of_gain": 0.49}
    assert retrieval_ceiling(True, 0.5, 4.0, 2.0)["ceiling"] == 1.143  # the share is of the baseline's latency
    assert retrieval_ceiling(True, 0.0, 1.0, 1.0)["share_of_gain"] is None  # nothing to gain: no share
    assert set(retrieval_ceiling(False, 0.5, 1.0, 0.8).values()) == {None}
    report = _report()
    assert "ceiling" not in render_markdown(report)  # no exact method in the table: no such columns
    report["baselines"]["demo"].append({"method": "RaLMSpec", "baseline": "RaLMSeq", "metric": "contains", "n": 4,
                                        "difference": 0.0, "ci95": [0.0, 0.0], "same_answers": 4,
                                        "latency_ratio": 0.975, "speedup": 1.026,
                                        **retrieval_ceiling(True, 0.05, 1.0, 1 / 1.026)})
    md = render_markdown(report)
    assert "| baseline retrieval | ceiling | share of gain |" in md
    assert "| 4/4 | 0.975 | 1.026 | 5.0% | 1.053 | 0.490 |" in md and "1 / (1 - the baseline's retrieval share)" in md
    assert "| 1/4 | 2.000 | 0.500 | — | — | — |" in md  # standard RAG against no retrieval
    page = render_html(report)
    assert "<th>ceiling</th>" in page and "<td>1.053</td>" in page and "<td>5.0%</td>" in page


def test_a_resumed_jobs_throughput_is_its_last_attempts_and_says_over_how_many():
    whole = {"wall_s": 8.0, "resumed": {"attempt": 1, "skipped_finished": 0},
             "attempts": [{"attempt": 1, "wall_s": 8.0, "counters": {"answered": 4}}]}
    assert job_throughput(whole, 4) == {"queries_per_s": 0.5, "queries_per_s_over": None, "job_wall_s": 8.0}
    # the first sitting ended with the session (no manifest): the second answered 3 of 4 in 6 s
    resumed = {"wall_s": 6.0, "resumed": {"attempt": 2, "skipped_finished": 1},
               "attempts": [{"attempt": 2, "wall_s": 6.0, "counters": {"answered": 3, "skipped_finished": 1}}]}
    assert job_throughput(resumed, 4) == {"queries_per_s": 0.5, "queries_per_s_over": 3, "job_wall_s": 6.0}
    assert job_throughput({"wall_s": 6.0, "resumed": {"skipped_finished": 4}, "attempts": [
        {"wall_s": 6.0, "counters": {"answered": 0}}]}, 4)["queries_per_s"] is None  # nothing left to time
    assert job_throughput({}, 4)["queries_per_s"] is None  # no manifest: still running, or failed
    report = _report()
    report["rows"]["demo"]["standard RAG"].update(queries_per_s=0.5, queries_per_s_over=3)
    assert "| 0.500 (3/4) |" in render_markdown(report) and "0.500 (3/4)" in render_html(report)
    assert "timed over its last attempt's k answers" in render_markdown(report)


@pytest.mark.slow
def test_compare_runs_reuses_and_checks_on_the_demo_data(tmp_path):
    """Two real answer jobs (Beam, SmolLM2) on six demo questions, the report (no secret option in
    it or in the manifests), then a rerun that reuses both runs, and --check against expectations
    that do and do not hold."""
    suite_text = GOOD.replace("generator=gemma3-270m", "generator=smollm2-135m-instruct")
    path = _suite(tmp_path, suite_text)
    secret = "--s3_secret_access_key=hunter2-in-compare"  # travels with every job; written nowhere
    outcome = run_compare(path, tmp_path / "work", check=True, runs_dir=tmp_path / "kept", extra_flags=[secret])
    assert [r.status for r in outcome.records] == ["ran", "ran"]
    written = [Path(f) for f in outcome.files.values()] + list((tmp_path / "kept").rglob("*.json"))
    assert written and not [f for f in written if "hunter2" in f.read_text()]
    assert not (tmp_path / "work" / "runs").exists()  # the jobs wrote under runs_dir
    rows = outcome.report["rows"]["demo"]
    for r in rows.values():
        assert r["n"] == 6 and r["dead_letters"] == 0 and r["missing"] == 0
        assert r["mean_latency_s"] > 0 and r["p95_latency_s"] >= r["p50_latency_s"] and r["queries_per_s"] > 0
        assert r["model_calls_per_q"] >= 1 and r["prompt_tokens_per_q"] > 0
    assert rows["no retrieval"]["in_flight"] == 1 and rows["standard RAG"]["in_flight"] == 4  # dataset, method flags
    assert rows["no retrieval"]["retrieval_calls_per_q"] == 0 and rows["standard RAG"]["retrieval_calls_per_q"] == 1
    [comparison] = outcome.report["baselines"]["demo"]
    assert comparison["n"] == 6 and comparison["ci95"][0] <= comparison["difference"] <= comparison["ci95"][1]
    assert comparison["same_machine"] is True  # both manifests name this machine's processor
    examples = outcome.report["examples"]["demo"]["standard RAG"]
    shown = [x for x in examples.values() if x]
    assert shown and all(x["retrieval"][0]["passages"][0]["text"] for x in shown)  # passages from the index
    assert rows["standard RAG"]["headline_metric"] == "contains"  # the first six demo questions are short-form
    assert outcome.failed_expectations == [] if 0 <= rows["standard RAG"]["contains"] <= 100 else False
    for f in ("markdown", "html", "json", "svg:demo"):
        assert Path(outcome.files[f]).stat().st_size > 0
    manifest = json.loads((tmp_path / "kept" / "demo" / "standard-rag" / "manifest.json").read_text())
    assert manifest["suite"] == "t" and manifest["suite_label"] == "standard RAG"
    assert manifest["machine"]["cores"] >= 1 and manifest["machine"]["cpu"]

    again = run_compare(path, tmp_path / "work", runs_dir=tmp_path / "kept", report_only=True)
    assert [r.status for r in again.records] == ["reused", "reused"]  # as their manifests record them
    assert again.report["rows"]["demo"]["standard RAG"]["contains"] == rows["standard RAG"]["contains"]

    measured = rows["standard RAG"]["contains"]
    wrong = suite_text.replace("value: 50, tolerance: 50", f"value: {measured + 10}, tolerance: 1")
    outcome2 = run_compare(_suite(tmp_path, wrong), tmp_path / "work", check=True, runs_dir=tmp_path / "kept")
    assert [r.status for r in outcome2.records] == ["reused", "reused"]  # same identities: nothing runs again
    assert outcome2.report["rows"]["demo"]["standard RAG"]["contains"] == measured
    assert len(outcome2.failed_expectations) == 1 and "outside" in outcome2.failed_expectations[0]

    # another suite, other labels, its own runs folder: the same jobs (identity and inputs) are copied, not run
    (tmp_path / "u").mkdir()
    other = _suite(tmp_path / "u", suite_text.split("expect:")[0].replace("name: t", "name: u")
                   .replace("label: standard RAG", "label: plain RAG"))
    outcome3 = run_compare(other, tmp_path / "work", runs_dir=tmp_path / "copy", reuse_from=(str(tmp_path / "kept"),))
    assert [r.status for r in outcome3.records] == ["reused", "reused"]
    assert outcome3.report["rows"]["demo"]["plain RAG"]["contains"] == measured
    copied, source = tmp_path / "copy" / "demo" / "plain-rag", tmp_path / "kept" / "demo" / "standard-rag"
    assert sorted(f.name for f in copied.iterdir()) == sorted(
        f.name for f in source.iterdir() if f.name.startswith(("results-", "dead_letters-", "manifest", "identity", "inputs")))
    assert json.loads((copied / "manifest.json").read_text()) == manifest
    contents = json.loads((source / "inputs.json").read_text())
    assert reusable_elsewhere([str(tmp_path / "kept")], manifest["run_fingerprint"], contents) == str(source)
    assert reusable_elsewhere([str(tmp_path / "kept")], manifest["run_fingerprint"], contents[:0]) is None  # other inputs
    assert reusable_elsewhere([str(tmp_path / "kept")], "0" * 16, contents) is None  # another identity
    (source / "inputs.json").unlink()  # a run from before inputs.json: its manifest's inputs decide
    assert reusable_elsewhere([str(tmp_path / "kept")], manifest["run_fingerprint"], contents) == str(source)
    assert reusable_elsewhere([str(tmp_path / "kept")], manifest["run_fingerprint"], contents[:0]) is None


@pytest.mark.slow
def test_report_screenshot_in_headless_chromium_shows_tables_and_plot(tmp_path, chromium):
    from PIL import Image
    page = tmp_path / "compare.html"
    page.write_text(render_html(_report()))
    shot = tmp_path / "shot.png"
    args = chromium
    subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120)
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert dom.count("<table") >= 2 and "<svg" in dom and "Pareto front" in dom
    image = Image.open(shot).convert("RGB")
    pixels = list(image.getdata())

    def near(color, tol=24):
        return sum(1 for p in pixels if all(abs(a - b) <= tol for a, b in zip(p, color)))
    assert near((0xf3, 0xf3, 0xf3), 2) > 2000  # table header cells
    assert near((0xd6, 0x27, 0x28)) > 150  # the front's markers and line
    assert near((0x33, 0x33, 0x33), 10) > 300  # the plot's axes
    dark = sum(1 for p in pixels if sum(p) < 200)
    assert dark > 3000  # text


def test_the_demo_suite_ships_with_the_package_and_shows_the_methods():
    """`make demo` runs this suite: the product's methods side by side, RaLMSpec against RaLMSeq."""
    from specrag.pipelines.demo import demo_suite_path
    suite = load_suite(demo_suite_path())
    assert [d.queries for d in suite.datasets] == ["demo"]
    assert {m.method for m in suite.methods} >= {"no-retrieval", "standard", "speculative-rag", "sps", "ralmseq",
                                                 "ralmspec"}
    ralmspec = next(m for m in suite.methods if m.method == "ralmspec")
    assert [suite.method(b).method for b in ralmspec.baselines] == ["ralmseq"]


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "benchmarks" / "suites").glob("*.yaml")))
def test_the_recorded_suites_load(name):
    """A suite in benchmarks/suites stays valid as methods and settings change (its runs are hours)."""
    suite = load_suite(REPO / "benchmarks" / "suites" / name)
    assert suite.datasets and suite.methods


def test_a_results_file_keeps_its_hand_written_reading_when_its_table_is_recorded_again(tmp_path, monkeypatch):
    """A suite resumed over many sessions re-records its table each time; the reading after the
    claim line is the part no script can redo, so it stays (and a first record has none)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from workloads import publish
    results = tmp_path / "r.md"
    publish(str(results), "T", "setup", "| a |\n|---|\n| 1 |", "x=1", command="python benchmarks/b.py")
    assert "## Reading" not in results.read_text() and results.read_text().endswith("x=1\n")
    results.write_text(results.read_text() + "\n## Reading\n\n- x is 1 because.\n")
    publish(str(results), "T", "setup", "| a |\n|---|\n| 2 |", "x=2", command="python benchmarks/b.py")
    text = results.read_text()
    assert "| 2 |" in text and "| 1 |" not in text and "Command: `python benchmarks/b.py`" in text
    assert text.index("x=2\n") < text.index("## Reading") and text.endswith("## Reading\n\n- x is 1 because.\n")


@pytest.mark.slow
def test_the_smoke_suite_meets_its_expectations(tmp_path):
    """`make compare-smoke`, the regression suite CI runs: the demo questions answered by no
    retrieval and standard RAG through `specrag compare --check`, each method within its
    recorded expectations (here, beside the other tests, rather than after them on one core)."""
    specrag = Path(sys.executable).with_name("specrag")
    done = subprocess.run([str(specrag), "compare", "--suite", str(REPO / "benchmarks" / "suites" / "smoke.yaml"),
                           "--check", "--workdir", str(tmp_path / "compare-smoke")], capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "## Expectations" in (tmp_path / "compare-smoke" / "compare.md").read_text()
