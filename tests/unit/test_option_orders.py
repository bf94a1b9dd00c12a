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
