"""train-drafter --option-orders: a multiple-choice example taught with its gold option at other
letters, the rationale's letter references moved with their options."""
from specrag.training.drafter import option_orders

CHOICES = ["corn", "air", "water", "blow up a beach ball or balloon"]
LABELS = ["A", "B", "C", "D"]
RATIONALE = "The answer D. blow up a beach ball shows air (D) takes space, unlike option A. Vitamin C. helps."


def test_each_order_puts_the_gold_option_at_another_letter_and_moves_its_references():
    orders = option_orders(CHOICES, LABELS, "D", RATIONALE, 4, "arc:q1")
    assert len(orders) == 4 and sorted(answer for _, answer, _ in orders) == LABELS
    for choices, answer, text in orders:
        assert sorted(choices) == sorted(CHOICES) and choices[LABELS.index(answer)] == CHOICES[3]
        corn = LABELS[choices.index("corn")]
        assert text == (f"The answer {answer}. blow up a beach ball shows air ({answer}) takes space, unlike option "
                        f"{corn}. Vitamin C. helps.")  # "C. helps" names no option's text: left alone
    assert orders == option_orders(CHOICES, LABELS, "D", RATIONALE, 4, "arc:q1")  # seeded by the key
    assert [a for _, a, _ in option_orders(CHOICES, LABELS, "D", RATIONALE, 2, "arc:q1")] == [a for _, a, _ in orders[:2]]


def test_gold_letters_spread_evenly_over_many_questions_and_nothing_changes_without_orders():
    from collections import Counter
    firsts = Counter(option_orders(CHOICES, LABELS, "A", "", 1, f"arc:q{i}")[0][1] for i in range(400))
    assert set(firsts) == set(LABELS) and min(firsts.values()) > 60
    assert option_orders(CHOICES, LABELS, "B", RATIONALE, 0, "k") == [(CHOICES, "B", RATIONALE)]
    assert option_orders(CHOICES, LABELS, "E", RATIONALE, 2, "k") == [(CHOICES, "E", RATIONALE)]  # not a label
    assert len(option_orders(CHOICES, LABELS, "B", RATIONALE, 9, "k")) == 4  # at most one per letter


def test_a_rationale_row_becomes_one_example_per_order_with_its_options_in_the_prompt():
    from specrag.pipelines.drafter import validate_rationale
    row = {"id": "arc_challenge:q1", "task_type": "multiple_choice", "question": "Which shows that air takes space?",
           "choices": CHOICES, "choice_labels": LABELS, "answer": "D", "rationale": RATIONALE,
           "doc_ids": ["p1"], "doc_titles": ["Air"], "doc_texts": ["Air fills a balloon."]}
    plain = validate_rationale(row, frozenset())
    assert len(plain) == 1 and plain[0].answer == "D" and "D. blow up a beach ball" in plain[0].prompt
    two = validate_rationale(row, frozenset(), option_orders=2)
    assert [e.id for e in two] == ["arc_challenge:q1"] * 2  # held out together
    assert [e.answer for e in two] == [a for _, a, _ in option_orders(CHOICES, LABELS, "D", RATIONALE, 2, row["id"])]
    for e in two:
        assert f"{e.answer}. blow up a beach ball or balloon" in e.prompt and e.rationale.startswith(f"The answer {e.answer}.")
    short = {**row, "task_type": "short_form", "choices": [], "choice_labels": [], "answer": "air"}
    assert len(validate_rationale(short, frozenset(), option_orders=2)) == 1  # open questions have no options
