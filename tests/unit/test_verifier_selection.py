"""benchmarks/verifier_selection.py on fixed traces: each draft judged by its set's rule, the
within-question AUC, the method's argmax (first draft on a tie), the majority vote and the
chosen-over-oracle share counted only over questions that hold a right and a wrong draft."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def vs():
    return load_script(BENCHMARKS / "verifier_selection.py", "verifier_selection")


def _draft(answer: str, rho_draft: float, rho_sc: float, rho_sr: float = -0.5, tokens: int = 10) -> dict:
    return {"answer": answer, "rho_draft": rho_draft, "rho_sc": rho_sc, "rho_sr": rho_sr,
            "draft_tokens": tokens, "sc_tokens": tokens}


def test_judge_uses_each_sets_rule(vs):
    short = {"answers": ["Paris", "City of Light"]}
    assert vs.judge("short_form", "It is Paris.", short, 0.5, "contains")
    assert not vs.judge("short_form", "Lyon", short, 0.5, "contains")
    assert vs.judge("short_form", "the city of light", short, 0.5, "f1")  # F1 1.0 after normalising
    assert not vs.judge("short_form", "a town far to the north of the light", short, 0.5, "f1")  # F1 0.44
    assert vs.judge("multiple_choice", " b ", {"answers": ["B"]}, 0.5, "contains")
    assert not vs.judge("claim_verification", "false", {"answers": ["true"]}, 0.5, "contains")


def test_auc_argmax_and_majority_on_fixed_drafts(vs):
    assert vs.pairwise_auc([[(3.0, True), (1.0, False), (2.0, False)]]) == 1.0
    assert vs.pairwise_auc([[(1.0, True), (1.0, False)], [(0.0, True), (2.0, False)]]) == 0.25
    assert vs.pairwise_auc([[(1.0, True), (2.0, True)]]) is None  # no wrong draft: no pair
    assert vs.argmax_right([(2.0, False), (2.0, True)]) is False  # a tie goes to the first draft
    assert vs.argmax_right([(1.0, False), (2.0, True)]) is True
    assert vs.majority_right(["The Paris", "Lyon", "paris"], [True, False, True]) is True
    assert vs.majority_right(["Lyon", "Paris"], [False, True]) is False  # a tie: the first answer met


def test_analyse_counts_only_questions_with_a_right_and_a_wrong_draft(vs, tmp_path):
    gold = {"q1": {"answers": ["Paris"]}, "q2": {"answers": ["Rome"]}, "q3": {"answers": ["Oslo"]}}
    rows = [
        # mixed: the sum picks the wrong draft, rho_draft the right one
        {"id": "q1", "task_type": "short_form", "trace": {"drafts": [
            _draft("Lyon", -5.0, -1.0), _draft("Paris", -1.0, -9.0), _draft("Lyon", -6.0, -2.0)]}},
        # all right: counted in the oracle, not among the mixed
        {"id": "q2", "task_type": "short_form", "trace": {"drafts": [_draft("Rome", -1.0, -1.0)]}},
        # all wrong, and one empty draft that is not a draft at all
        {"id": "q3", "task_type": "short_form", "trace": {"drafts": [_draft("Bergen", -1.0, -1.0), _draft("", 0, 0)]}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "results-000.parquet")
    out = vs.analyse(tmp_path, gold, "contains", 0.5)
    assert (out["questions"], out["oracle"], out["mixed"]) == (3, 2, 1)
    assert out["random"] == pytest.approx(1 / 3) and out["majority"] == 0.0  # "Lyon" twice
    assert out["sum (default)"] == {"auc": 0.0, "chosen": 0.0}
    assert out["rho_draft"] == {"auc": 1.0, "chosen": 1.0}
    assert out["rho_SC"] == {"auc": 0.0, "chosen": 0.0}
    # the drafts' consensus: "Lyon" is given by two drafts of three
    assert [d["agreement"] for d in vs.with_agreement(rows[0]["trace"]["drafts"])] == [2, 1, 2]
    # per token (10 a draft) "Paris" scores -0.1, the first "Lyon" -0.5 + log 2: the consensus wins, wrongly
    assert out["rho_draft per token"]["chosen"] == 1.0 and out["rho_draft per token + log agreement"]["chosen"] == 0.0
    # the drafter_train traces are read a second time on the held-out rationales' questions alone
    held = vs.analyse(tmp_path, gold, "contains", 0.5, only={"q2", "q3"})
    assert (held["questions"], held["oracle"], held["mixed"]) == (2, 1, 0) and "random" not in held
