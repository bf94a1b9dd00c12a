"""Speculative RAG's tuned drafter: the splits it trains and is evaluated on, rationale synthesis
as a Beam job (a real teacher model, the filters), and train-drafter (the loss falls, the folder
serves as a drafter, a rerun on the same content is reused)."""
import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.evaluation.metrics import contains
from specrag.pipelines.cli import main


def test_the_drafter_training_split_shares_no_id_with_any_evaluation_split():
    from specrag.evaluation.splits import EVALUATION_SPLITS, evaluation_ids, load_split
    train = set(load_split("drafter_train"))
    assert train and not train & evaluation_ids()
    assert set(load_split("aed_train")) <= train  # the same hash: AED's training questions stay training ones
    assert not set(load_split("drafter_eval")) & set(load_split("aed_train"))
    for dataset in ("pubhealth:", "arc_challenge:", "nq:", "hotpotqa:"):  # claims and choices are taught too
        assert any(i.startswith(dataset) for i in train)
        assert any(i.startswith(dataset) for name in EVALUATION_SPLITS for i in load_split(name))
    assert not any(i.startswith("popqa:") for i in train)


def test_a_rationale_is_kept_only_when_it_names_the_answer():
    from specrag.methods.rationale_synthesis import clean_rationale, gold_answer, names_answer
    arc = {"id": "x", "task_type": "multiple_choice", "answers": ["C"], "choice_labels": ["A", "B", "C", "D"],
           "choices": ["rain", "snow", "hail", "fog"], "question": "?"}
    assert gold_answer(arc) == ("C", "C. hail", [])  # the teacher reads the option; entailment judges
    assert names_answer("Hail forms in storms.", ["hail"]) and not names_answer("Rain falls.", ["hail"])
    # the 1.5B teacher's paraphrases (drafter_train NQ) reach the judge; a rationale naming another answer does not
    paraphrases = [("Motor neurons are called efferent.", ["efferent nerves"]),
                   ("The Jeep is sold as an off-road vehicle.", ["off-road vehicles"]),
                   ("The revival meeting was to evangelize.", ["evangelizing"]),
                   ("The wind blows between April and September.", ["till September"])]
    for rationale, answers in paraphrases:
        assert names_answer(rationale, answers) and not names_answer(rationale, answers, "exact")
    assert not names_answer("In 1976 Peter Finch became the first posthumous winner.", ["Rocky"])
    assert not names_answer("The tissue is nervous.", ["nerves"]) and not names_answer("It is 1977.", ["1976"])
    assert gold_answer({"id": "y", "task_type": "claim_verification", "answers": ["True"]})[0] == "true"
    assert names_answer("anything", [])  # a claim's label is judged by entailment, not by name
    assert clean_rationale("Rationale: Canberra is\nthe capital.\n\nMore.") == "Canberra is the capital."
    with pytest.raises(ValueError, match="no gold answer"):
        gold_answer({"id": "z", "task_type": "short_form", "answers": [" "]})
    from specrag.methods import create_method
    with pytest.raises(ValueError, match="docs_per_draft=11 exceeds top_k=10"):
        create_method("rationale-synthesis", docs_per_draft=11)
    with pytest.raises(ValueError, match="answer_match must be one of"):
        create_method("rationale-synthesis", answer_match="fuzzy")


def test_synthesis_writes_rationale_rows_filters_and_refuses_evaluation_ids(demo_tables, demo_index, tmp_path):
    """SmolLM2-135M as the teacher (no entailment judgement: the next test has it) over four demo
    questions and one of an evaluation split: every question is a row with its verdict, the
    evaluation id a dead letter, the kept rows a training table with questions and passages."""
    from specrag.evaluation.splits import load_split
    from specrag.methods.rationale_synthesis import REASONS, names_answer
    rows = [r for r in pq.read_table(demo_tables[0]).to_pylist() if r["id"] in
            ("demo-q00", "demo-q12", "demo-q19", "demo-q20")]
    held = {**rows[0], "id": load_split("drafter_eval")[0]}
    pq.write_table(pa.Table.from_pylist(rows + [held]), tmp_path / "queries.parquet")
    out = tmp_path / "synthesis"
    assert main(["synthesize-rationales", "--queries", str(tmp_path / "queries.parquet"), "--index", str(demo_index),
                 "--output", str(out), "--model", "teacher=smollm2-135m-instruct", "--set", "entailment=false",
                 "--set", "max_new_tokens=32", "--threads", "1"]) == 0
    results = [r for f in sorted(out.glob("results-*.parquet")) for r in pq.read_table(f).to_pylist()]
    dead = [r for f in sorted(out.glob("dead_letters-*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in rows)
    assert [d["id"] for d in dead] == [held["id"]] and "evaluation split" in dead[0]["message"]
    answers = {r["id"]: r["answers"] for r in rows}
    passages = {p["id"]: p["text"] for p in pq.read_table(demo_tables[1]).to_pylist()}
    for r in results:
        t = r["trace"]
        assert t["reason"] in REASONS and t["kept"] == (t["reason"] == "kept")
        assert t["answer"] == answers[r["id"]][0]
        if t["reason"] != "answer_not_in_documents":
            assert len(t["doc_ids"]) == 2 and t["rationale"]  # the 2-document subset the drafter will see
        if t["reason"] != "answer_not_in_documents" and t["task_type"] == "short_form":
            assert contains(" ".join(passages[d] for d in t["doc_ids"]), answers[r["id"]])
        if t["reason"] == "answer_not_in_rationale":
            assert not names_answer(t["rationale"], answers[r["id"]])
        if t["reason"] == "kept":  # no judgement asked; an open question's rationale names its answer
            assert t["support_yes"] is None
            assert t["task_type"] != "short_form" or names_answer(t["rationale"], answers[r["id"]])
    reasons = [r["trace"]["reason"] for r in results]
    assert "answer_not_in_rationale" in reasons and "kept" in reasons  # the small teacher names another answer for some
    summary = json.loads((out / "synthesis.json").read_text())
    assert summary["questions"] == 4 and summary["kept"] + summary["filtered"] == 4
    assert summary["by_reason"] == {k: reasons.count(k) for k in sorted(set(reasons))}
    kept = pq.read_table(out / "rationales.parquet").to_pylist()
    assert sorted(k["id"] for k in kept) == sorted(r["id"] for r in results if r["trace"]["kept"])
    for k in kept:  # the training table holds the question and the passages; the run itself only ids
        assert k["question"] and k["doc_texts"] == [passages[d] for d in k["doc_ids"]]


def test_the_teachers_judgement_filters_a_rationale_it_does_not_find_supporting(demo_tables, demo_index, generator,
                                                                              embedder):
    from specrag.inference import Engine, EngineConfig, Services
    from specrag.methods import create_method
    from specrag.methods.local_run import run_method
    from specrag.retrieval.index import open_retriever
    rows = [r for r in pq.read_table(demo_tables[0]).to_pylist() if r["id"] in ("demo-q00", "demo-q01")]
    engine = Engine(Services(models={"teacher": generator, "embedder": embedder},
                             retriever=open_retriever(demo_index, "bm25")), EngineConfig())
    try:
        states, failures = run_method(engine, create_method("rationale-synthesis", max_new_tokens=24), rows)
    finally:
        engine.close()
    assert not failures
    for s in states:
        t = s.trace.method_record()
        assert t["answer_in_rationale"] and t["support_yes"] is not None and t["support_no"] is not None
        assert t["kept"] == (t["support_yes"] > t["support_no"]) and t["reason"] == ("kept" if t["kept"] else "not_entailed")


def _rationale_rows(demo_tables, n: int = 6) -> list[dict]:
    """Rationale rows as synthesize-rationales writes them, from demo questions whose answer is in
    a demo passage (that passage's sentence as the rationale)."""
    passages = pq.read_table(demo_tables[1]).to_pylist()
    out = []
    for q in pq.read_table(demo_tables[0]).to_pylist():
        found = [p for p in passages if contains(p["text"], q["answers"])]
        if found and len(out) < n:
            p, other = found[0], passages[len(out)]
            out.append({"id": q["id"], "dataset": "demo", "task_type": q["task_type"], "question": q["question"],
                        "choices": [], "choice_labels": [], "answer": q["answers"][0],
                        "doc_ids": [p["id"], other["id"]], "doc_titles": [p["title"], other["title"]],
                        "doc_texts": [p["text"], other["text"]], "rationale": p["text"].split(". ")[0] + ".",
                        "support_yes": -0.1, "support_no": -2.0})
    return out


def test_train_drafter_lowers_the_loss_and_serves_as_the_drafter(demo_tables, demo_index, tiny_llama_folder,
                                                                  tmp_path):
    from specrag.inference.models import model_spec
    from specrag.pipelines.drafter import RATIONALES
    rows = _rationale_rows(demo_tables)
    from specrag.evaluation.splits import load_split
    leak = {**rows[0], "id": load_split("aed_eval")[0]}  # an evaluation id: a dead letter, never trained on
    pq.write_table(pa.Table.from_pylist(rows + [leak], schema=RATIONALES), tmp_path / "rationales.parquet")
    model = tmp_path / "drafter"
    args = ["train-drafter", "--rationales", str(tmp_path / "rationales.parquet"), "--output", str(model),
            "--base", str(tiny_llama_folder), "--epochs", "6", "--batch-size", "2", "--learning-rate", "3e-3",
            "--held-out", "0.2", "--checkpoint-every", "3", "--threads", "1"]
    assert main(args) == 0
    manifest = json.loads((model / "training_manifest.json").read_text())
    report = manifest["report"]
    assert report["examples"] + report["held_out_examples"] == len(rows)
    assert report["epoch_loss"][-1] < report["epoch_loss"][0]
    assert report["held_out_loss_trained"] < report["held_out_loss_untrained"]
    assert manifest["dead_letters"] == 1
    assert pq.read_table(model / "dead_letters.parquet").column("id").to_pylist() == [leak["id"]]
    assert model_spec(str(model)).kind == "causal-lm"
    stamp = (model / "model.safetensors").stat().st_mtime_ns
    assert main(args) == 0 and (model / "model.safetensors").stat().st_mtime_ns == stamp  # same content: reused
    assert main([*args, "--seed", "1"]) == 2  # other settings: the model there is kept unless --overwrite
    # into an object store: staged on this machine, the same files put in the store's folder
    import remotefs  # the specragtest:// scheme (tests/remotefs.py)
    remotefs.ROOT["path"] = str(tmp_path / "bucket")
    (tmp_path / "bucket").mkdir()
    try:
        assert main([*args[:4], "specragtest://drafter", *args[5:]]) == 0
    finally:
        remotefs.ROOT["path"] = None
    stored = tmp_path / "bucket" / "drafter"
    assert sorted(p.name for p in stored.iterdir()) == sorted(p.name for p in model.iterdir())
    assert (stored / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    run = _answers_as_the_drafter(model, demo_tables, demo_index, tiny_llama_folder, tmp_path)
    assert run["identity"]["models"]["drafter"].startswith(str(model))


def _answers_as_the_drafter(model, demo_tables, demo_index, verifier, tmp_path) -> dict:
    """Two demo questions answered by Speculative RAG with ``model`` drafting: the run's manifest."""
    queries = tmp_path / "queries.parquet"
    pq.write_table(pq.read_table(demo_tables[0]).slice(0, 2), queries)
    assert main(["answer", "--method", "speculative-rag", "--queries", str(queries), "--index", str(demo_index),
                 "--output", str(tmp_path / "run"), "--model", f"drafter={model}",
                 "--model", f"verifier={verifier}", "--set", "drafts=2", "--set", "top_k=4",
                 "--threads", "1"]) == 0
    results = [r for f in sorted((tmp_path / "run").glob("results-*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(results) == 2 and all(len(r["trace"]["drafts"]) == 2 for r in results)
    return json.loads((tmp_path / "run" / "manifest.json").read_text())


def test_a_lora_drafter_resumes_after_a_kill_and_serves_merged_over_its_base(demo_tables, demo_index,
                                                                            tiny_llama_folder, tmp_path):
    """--lora-rank: the base frozen, an adapter trained; a run killed after a checkpoint resumes
    from it, and one stopped by SIGTERM from the step it stopped at, both to the uninterrupted
    run's losses and adapter; the folder holds the adapter and a card with
    its sha256, loads merged over its base (the answer job runs it as the drafter), and a damaged
    adapter is refused in one line."""
    import torch
    from safetensors.torch import load_file
    from specrag.inference.models import ADAPTER_WEIGHTS, CARD, model_identity, model_spec, trained_spec
    from specrag.pipelines.drafter import validate_rationale
    import os
    import signal
    from specrag.training.drafter import DrafterTrainingConfig, train_drafter
    from specrag.training.state import TrainingStopped, partial_dir
    examples = [e for r in _rationale_rows(demo_tables) for e in validate_rationale(r, frozenset())]
    config = DrafterTrainingConfig(epochs=3, batch_size=2, learning_rate=3e-3, held_out=0.2, checkpoint_every=2,
                                   lora_rank=4, lora_alpha=8)
    whole = train_drafter(examples, config, tmp_path / "whole", base=str(tiny_llama_folder))

    class Killed(Exception):
        pass

    def dies_at_the_second_checkpoint(line: str) -> None:
        if line.startswith("drafter checkpoint at step 4/"):
            raise Killed  # after the first checkpoint's state was saved
    with pytest.raises(Killed):
        train_drafter(examples, config, tmp_path / "b", base=str(tiny_llama_folder),
                      progress=dies_at_the_second_checkpoint)
    assert (partial_dir(tmp_path / "b") / "state.pt").is_file()
    resumed = train_drafter(examples, config, tmp_path / "b", base=str(tiny_llama_folder))
    assert resumed.resumed_at == [2] and resumed.step_loss == whole.step_loss
    assert whole.total_steps == resumed.total_steps == len(whole.step_loss)  # what a checkpoint is a part of
    assert resumed.held_out_loss_trained < resumed.held_out_loss_untrained

    def signalled_at_the_second_checkpoint(line: str) -> None:
        if line.startswith("drafter checkpoint at step 4/"):
            os.kill(os.getpid(), signal.SIGTERM)  # as a session's end or `kill` sends it
    with pytest.raises(TrainingStopped, match=r"after step 4/\d+, its state saved .*--resume continues"):
        train_drafter(examples, config, tmp_path / "c", base=str(tiny_llama_folder),
                      progress=signalled_at_the_second_checkpoint)
    stopped = train_drafter(examples, config, tmp_path / "c", base=str(tiny_llama_folder))
    assert stopped.resumed_at == [4] and stopped.step_loss == whole.step_loss  # no step lost, none repeated
    from dataclasses import replace
    accumulated = train_drafter(examples, replace(config, micro_batch=1), tmp_path / "micro",
                                base=str(tiny_llama_folder))  # one example a pass, the same steps
    assert accumulated.step_loss == pytest.approx(whole.step_loss, rel=1e-3)
    a, b, c = (load_file(str(tmp_path / run / ADAPTER_WEIGHTS)) for run in ("whole", "b", "c"))
    assert a.keys() == b.keys() and all("lora_" in k for k in a)
    assert {v.dtype for v in a.values()} == {torch.float16}  # stored at half the bytes, merged in float32
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    folder = tmp_path / "b"
    assert not (folder / "model.safetensors").exists() and not partial_dir(folder).exists()
    card = json.loads((folder / CARD).read_text())
    assert card["adapter_of"] == str(tiny_llama_folder) and card["adapter_dtype"] == "float16"
    assert card["adapter_sha256"] == hashlib.sha256((folder / ADAPTER_WEIGHTS).read_bytes()).hexdigest()
    merged = model_spec(str(folder)).locate()
    assert trained_spec(folder, name="shipped-drafter").locate() == merged  # as a registered name ships it
    assert (merged / "model.safetensors").is_file() and model_spec(str(folder)).kind == "causal-lm"
    base = load_file(str(tiny_llama_folder / "model.safetensors"))
    weights = load_file(str(merged / "model.safetensors"))
    changed = [k for k in base if not torch.equal(base[k], weights[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # the adapted linear layers, merged in
    run = _answers_as_the_drafter(folder, demo_tables, demo_index, tiny_llama_folder, tmp_path)
    assert run["identity"]["models"]["drafter"] == model_identity(str(folder))
    damaged = tmp_path / "damaged"
    import shutil
    shutil.copytree(folder, damaged)
    (damaged / ADAPTER_WEIGHTS).write_bytes((folder / ADAPTER_WEIGHTS).read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="is not the .* its card .* names: the file is damaged or was replaced"):
        model_spec(str(damaged)).locate()


def test_patience_ends_the_run_at_its_best_checkpoint_and_a_resumed_run_ends_there_too(demo_tables, tiny_llama_folder,
                                                                                       tmp_path, monkeypatch):
    """--patience N: once N checkpoints in a row have not lowered the held-out loss the run ends, saving
    the best checkpoint. Patience is not part of what a saved state resumes by (it changes where the
    run ends, not its steps), so a run stopped without it resumes with it and ends at once."""
    import os
    import signal
    import torch
    from safetensors.torch import load_file
    import specrag.training.drafter as drafter
    from specrag.inference.models import ADAPTER_WEIGHTS
    from specrag.pipelines.drafter import validate_rationale
    from specrag.training.state import TrainingStopped
    examples = [e for r in _rationale_rows(demo_tables) for e in validate_rationale(r, frozenset())]
    config = drafter.DrafterTrainingConfig(epochs=3, batch_size=2, learning_rate=3e-3, held_out=0.2,
                                           checkpoint_every=2, lora_rank=4, lora_alpha=8, patience=2)
    losses = iter([3.0, 2.0, 1.0, 1.5, 1.6])  # untrained, then steps 2, 4 (the best), 6, 8
    monkeypatch.setattr(drafter, "held_out_loss", lambda *a: next(losses))
    early = drafter.train_drafter(examples, config, tmp_path / "early", base=str(tiny_llama_folder))
    assert (early.stopped_early_at, early.best_step, early.held_out_loss_trained) == (8, 4, 1.0)
    assert len(early.step_loss) == 8 < early.total_steps

    losses = iter([3.0, 2.0, 1.0, 1.5])  # the same steps, stopped after step 6 by a signal

    def signalled_at_step_6(line: str) -> None:
        if line.startswith("drafter checkpoint at step 6/"):
            os.kill(os.getpid(), signal.SIGTERM)
    from dataclasses import replace
    with pytest.raises(TrainingStopped):
        drafter.train_drafter(examples, replace(config, patience=0), tmp_path / "late", base=str(tiny_llama_folder),
                              progress=signalled_at_step_6)
    resumed = drafter.train_drafter(examples, replace(config, patience=1), tmp_path / "late",
                                    base=str(tiny_llama_folder))
    assert resumed.resumed_at == [6] and (resumed.stopped_early_at, resumed.best_step) == (6, 4)
    a, b = (load_file(str(tmp_path / run / ADAPTER_WEIGHTS)) for run in ("early", "late"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # both saved step 4's adapter
