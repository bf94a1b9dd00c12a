"""benchmarks/utility_picks.py on fixed traces: AED-RAG's picks judged against the retriever's
top m, top 5 and top 1 and a random m, each passage by the reader's view of it (title and text)
against the gold answers, with the predictor's rank agreement with the retriever's order."""
from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def up():
    return load_script(BENCHMARKS / "utility_picks.py", "utility_picks")


def test_a_random_pick_holds_the_answer_at_its_hypergeometric_chance(up):
    assert up.random_hit(10, 0, 2) == 0.0
    assert up.random_hit(10, 1, 2) == pytest.approx(0.2)  # 1 - C(9,2)/C(10,2) = 1 - 36/45
    assert up.random_hit(10, 3, 2) == pytest.approx(1 - 21 / 45)
    assert up.random_hit(2, 1, 2) == 1.0 and up.random_hit(2, 0, 5) == 0.0


def test_picks_are_judged_against_the_retrievers_order(up):
    trace = {"passage_ids": ["a", "b", "c", "d", "e", "f"], "passage_scores": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
             "chosen_passages": ["f", "e"]}
    holds = {"a": True, "b": False, "c": False, "d": False, "e": False, "f": False}
    q = up.question_picks(trace, holds)
    assert (q["picks"], q["top_m"], q["top_5"], q["top_1"]) == (False, True, True, True)
    assert q["ranks"] == [6, 5] and q["rho_retriever"] == pytest.approx(-1.0)  # the retriever's order reversed
    assert q["random_m"] == pytest.approx(1 - 10 / 15)


def test_a_run_is_read_from_its_results_and_the_reader_view_of_each_passage(up, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"id": "q1", "trace": {"passage_ids": ["p1", "p2", "p3"], "passage_scores": [3.0, 2.0, 1.0],
                                   "chosen_passages": ["p1"]}},
            {"id": "q2", "trace": {"passage_ids": ["p2", "p3", "p1"], "passage_scores": [1.0, 1.0, 1.0],
                                   "chosen_passages": ["p3"]}},
            {"id": "q3", "trace": {"passage_ids": [], "passage_scores": [], "chosen_passages": []}}]  # none retrieved
    pq.write_table(pa.Table.from_pylist(rows), run / "results-000.parquet")
    texts = {"p1": "Paris\nThe capital of France.", "p2": "Lyon\nA city on the Rhone.", "p3": "Nice\nOn the coast."}
    gold = {"q1": {"answers": ["Paris"]}, "q2": {"answers": ["Rhone"]}, "q3": {"answers": ["x"]}}
    a = up.analyse(run, gold, texts)  # q1: the title holds it, picked; q2: top 1 holds it, the pick does not
    assert a["questions"] == 2 and a["m"] == [1]
    assert (a["picks"], a["top_m"], a["top_5"], a["lost"]) == (0.5, 1.0, 1.0, 1)
    assert a["rho_retriever"] == pytest.approx(1.0)  # q2's constant scores have no rank agreement: left out
    assert a["random_m"] == pytest.approx((1 / 3 + 1 / 3) / 2) and a["pick_rank_mean"] == 1.5
    assert not math.isnan(a["top_1"])
