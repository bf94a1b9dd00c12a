import pytest

from specrag.schemas import RowError, validate_passage, validate_query


def test_valid_query_is_normalised():
    q = validate_query({"id": "a", "question": "  Who?  ", "answers": ["x"]})
    assert q["question"] == "Who?"
    assert q["task_type"] == "short_form"
    assert q["metadata"] == "{}"


@pytest.mark.parametrize("row, field, fragment", [
    ({"id": "a"}, "question", "missing"),
    ({"id": "a", "question": "   "}, "question", "empty"),
    ({"id": "a", "question": 42}, "question", "expected a string, got int"),
    ({"id": 7, "question": "q"}, "id", "expected a string, got int"),
    ({"id": "", "question": "q"}, "id", "empty"),
    ({"id": "a", "question": b"\xff\xfe bad"}, "question", "invalid UTF-8 at byte 0"),
    ({"id": "a", "question": "bad \ud800"}, "question", "lone surrogate"),
    ({"id": "a", "question": "q", "task_type": "essay"}, "task_type", "not one of"),
    ({"id": "a", "question": "q", "task_type": "multiple_choice", "choices": ["x"]}, "choices", "at least two"),
    ({"id": "a", "question": "q", "answers": "x"}, "answers", "expected a list"),
    ({"id": "a", "question": "q", "metadata": "[1]"}, "metadata", "JSON object"),
])
def test_bad_query_rows_name_the_field(row, field, fragment):
    with pytest.raises(RowError) as err:
        validate_query(row)
    assert err.value.field == field
    assert fragment in str(err.value)


def test_multiple_choice_gets_default_labels():
    q = validate_query({"id": "a", "question": "q", "task_type": "multiple_choice", "choices": ["x", "y", "z"]})
    assert q["choice_labels"] == ["A", "B", "C"]


def test_a_task_type_the_method_does_not_answer_is_rejected_at_validation():
    row = {"id": "a", "question": "q", "task_type": "multiple_choice", "choices": ["x", "y"]}
    assert validate_query(row, task_types=None)["task_type"] == "multiple_choice"
    with pytest.raises(RowError, match="answers short_form questions only") as err:
        validate_query(row, task_types=("short_form",))
    assert err.value.field == "task_type"
    assert validate_query({"id": "b", "question": "q"}, task_types=("short_form",))["task_type"] == "short_form"


def test_passage_int_ids_are_accepted_as_text():
    assert validate_passage({"id": 12, "title": None, "text": "t"}) == {"id": "12", "title": "", "text": "t"}
    with pytest.raises(RowError):
        validate_passage({"id": "p", "text": ""})
