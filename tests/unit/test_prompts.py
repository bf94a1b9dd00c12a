"""The prompt layouts: documents before the question (every method), or after it (SPS, as its
paper's Appendix A), where one question's prompts over different documents share a prefix."""
from specrag.methods.prompts import INSTRUCTIONS, build_prompt
from specrag.methods.sps import SPSConfig
from specrag.retrieval.base import Hit

QUERY = {"question": "Who wrote it?", "task_type": "short_form"}
ONE, TWO = [Hit("a", 1.0, "Title", "first text")], [Hit("b", 1.0, "", "second text")]


def test_documents_come_before_the_question_by_default():
    assert build_prompt(QUERY, ONE) == (f"{INSTRUCTIONS['short_form']}\n\nDocuments:\n[1] Title: first text\n\n"
                                        "Question: Who wrote it?\nAnswer:")


def test_question_first_prompts_of_one_question_share_the_instruction_and_question():
    a, b = build_prompt(QUERY, ONE, question_first=True), build_prompt(QUERY, TWO, question_first=True)
    shared = f"{INSTRUCTIONS['short_form']}\n\nQuestion: Who wrote it?\n\nDocuments:\n[1] "
    assert a == shared + "Title: first text\nAnswer:" and b == shared + "second text\nAnswer:"
    assert build_prompt(QUERY, question_first=True) == build_prompt(QUERY)  # no documents: one layout
    assert SPSConfig().question_first  # SPS writes its candidates with the paper's prompt


def test_a_stages_subsets_list_the_documents_more_of_them_share_first():
    from specrag.methods.sps import shared_first
    # one document per k-means group: 7 and 9 are singletons, in every subset
    subsets = [[0, 7, 3, 9], [1, 7, 3, 9], [0, 7, 4, 9]]
    assert shared_first(subsets) == [[7, 9, 0, 3], [7, 9, 3, 1], [7, 9, 0, 4]]
    assert [sorted(s) for s in shared_first(subsets)] == [sorted(s) for s in subsets]  # the same sets
