import pytest

from specrag.evaluation.metrics import (choice_accuracy, contains, exact_match, f1, normalize,
                                        rouge_l, score_row, str_em)


def test_squad_normalisation():
    assert normalize("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("the Beatles", ["Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0


def test_f1_partial_overlap():
    assert f1("George Rankin politician", ["politician"]) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert f1("nothing", ["politician"]) == 0.0


def test_contains_accuracy_self_rag_convention():
    assert contains("He was an Australian soldier and politician.", ["political leader", "politician"]) == 1.0
    assert contains("He was a soldier.", ["politician"]) == 0.0
    assert contains("anything", [""]) == 0.0


def test_closed_set_and_long_form():
    assert choice_accuracy("C", ["C"]) == 1.0
    assert choice_accuracy(None, ["C"]) == 0.0
    assert str_em("Ali Daei scored most; Bican too", [["Daei"], ["Josef Bican", "Bican"], ["Sinclair"]]) == pytest.approx(2 / 3)
    assert rouge_l("the cat sat on the mat", ["the cat sat on the mat"]) == pytest.approx(1.0)
    assert 0 < rouge_l("the cat sat", ["the cat sat on the mat"]) < 1


def test_score_row_by_task_type():
    gold = {"answers": ["Paris"], "answer_groups": []}
    assert score_row("short_form", "Paris", "Paris.", None, gold) == {"contains": 1.0, "em": 1.0, "f1": 1.0}
    assert score_row("multiple_choice", "B", "B", "B", {"answers": ["B"]}) == {"accuracy": 1.0}


def test_contains_scores_the_answer_not_the_reasoning_that_quoted_a_passage():
    # SARDI's response: steps copying a retrieved sentence, then its answer after ###
    gold = {"answers": ["politician"], "answer_groups": []}
    raw = "Step 1: He is a Thai politician and actor.\n### Thai actor"
    assert score_row("short_form", "Thai actor", raw, None, gold)["contains"] == 0.0
    assert score_row("short_form", "", raw, None, gold)["contains"] == 0.0  # no answer given
    assert score_row("short_form", "a politician", raw, None, gold)["contains"] == 1.0
