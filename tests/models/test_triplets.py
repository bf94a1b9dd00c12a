"""Triplet extraction: the rules on hand-checked sentences, the generator's line format, and
the `extract-triplets` Beam job (dead letters, empty sets, resume, a non-local scheme)."""
from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specrag.inference.types import Generation
from specrag.pipelines.extract_triplets import ExtractJob, run_extract_triplets
from specrag.retrieval.triplets import (GeneratorTripletExtractor, Passage, Triplet, TripletStore, line_logprobs,
                                        normalise, parse_triplet_lines)
from specrag.transforms.triplets import ExtractorConfig

import remotefs  # the specragtest:// scheme (tests/remotefs.py)

# hand-checked: what a reader would write down for each sentence
SENTENCES = {
    "active + coordinated objects": (
        "Marie Curie discovered radium and polonium.",
        [("Marie Curie", "discovered", "radium"), ("Marie Curie", "discovered", "polonium")]),
    "passive with agent and prepositional object": (
        "The book was written by Tolkien in 1937.",
        [("book", "was written by", "Tolkien"), ("book", "was written in", "1937")]),
    "copula": (
        "Paris is the capital of France.",
        [("Paris", "is", "capital of France")]),
    "copula with adjective": (
        "The sky is blue.",
        [("sky", "is", "blue")]),
    "passive without agent": (
        "Obama was born in Honolulu.",
        [("Obama", "was born in", "Honolulu")]),
    "coordinated subjects": (
        "Alice and Bob founded Acme in Boston.",
        [("Alice", "founded", "Acme"), ("Bob", "founded", "Acme"),
         ("Alice", "founded in", "Boston"), ("Bob", "founded in", "Boston")]),
    "relative clause": (
        "The Eiffel Tower, which was designed by Gustave Eiffel, is located in Paris.",
        [("Eiffel Tower", "was designed by", "Gustave Eiffel"), ("Eiffel Tower", "is located in", "Paris")]),
    "appositive": (
        "Barack Obama, the 44th president, was born in Hawaii.",
        [("Barack Obama", "is", "44th president"), ("Barack Obama", "was born in", "Hawaii")]),
    "participle modifier": (
        "Casablanca is a 1942 film directed by Michael Curtiz.",
        [("Casablanca", "is", "1942 film"), ("1942 film", "directed by", "Michael Curtiz")]),
    "negation": (
        "The album was not released in Europe.",
        [("album", "was not released in", "Europe")]),
}


@pytest.fixture(scope="module")
def rules():
    from specrag.retrieval.triplet_rules import RuleTripletExtractor
    return RuleTripletExtractor()


def _triples(extraction):
    return [(t.head, t.relation, t.tail) for t in extraction.triplets]


@pytest.mark.parametrize("case", sorted(SENTENCES))
def test_rules_extract_the_hand_checked_triplets(rules, case):
    sentence, expected = SENTENCES[case]
    [extraction] = rules.extract([Passage("p", "", sentence)])
    assert _triples(extraction) == expected
    assert extraction.sentences == 1 and {t.sentence for t in extraction.triplets} == {0}


def test_rules_read_subject_pronouns_as_the_title_and_share_subjects_across_coordinated_verbs(rules):
    text = "He founded the company in 1998 and led it until 2005. She decided to study law."
    [ex] = rules.extract([Passage("p", "Jim Smith (businessman)", text)])
    assert _triples(ex) == [("Jim Smith", "founded", "company"), ("Jim Smith", "founded in", "1998"),
                            ("Jim Smith", "led until", "2005"), ("Jim Smith", "decided to study", "law")]
    assert [t.sentence for t in ex.triplets] == [0, 0, 0, 1] and ex.sentences == 2
    # without a title (or with --keep-pronouns) a pronoun end is no fact: dropped
    [bare] = rules.extract([Passage("p", "", text)])
    assert bare.triplets == ()


def test_a_passage_without_facts_is_an_empty_set_not_an_error(rules):
    [ex] = rules.extract([Passage("p", "T", "Hello there!")])
    assert ex.triplets == () and ex.sentences == 1


def test_normalise_cleans_and_deduplicates_per_passage():
    raw = [Triplet(" The  Beatles ", "Were formed in", "Liverpool."), Triplet("Beatles", "were formed in", "liverpool"),
           Triplet("X", "is", "x"), Triplet("", "is", "y"), Triplet("A " * 20, "is", "b")]
    assert [(t.head, t.relation, t.tail) for t in normalise(raw)] == [("Beatles", "were formed in", "Liverpool")]


def test_generator_lines_are_parsed_with_their_scores_and_sentences():
    out = "<Marie Curie; was born in; Warsaw>\nnoise line\n<Marie Curie; discovered; polonium> <bad>\n"
    text = "Marie Curie was born in Warsaw. She discovered polonium."
    found = parse_triplet_lines(out, text, [-0.5, -9.0, -1.5])
    assert [(t.head, t.relation, t.tail, t.sentence, t.score) for t in found] == [
        ("Marie Curie", "was born in", "Warsaw", 0, -0.5), ("Marie Curie", "discovered", "polonium", 1, -1.5)]


def test_line_logprobs_attribute_each_token_to_the_line_it_ends():
    pieces = ["<a", "; b", "; c>\n", "<d", "; e; f>"]
    detok = lambda idss: ["".join(pieces[:len(ids)]) for ids in idss]
    assert line_logprobs([0, 1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0, -6.0], detok) == [-2.0, -5.0]


class _FakeGenerator:
    """Orchestration only: returns a fixed completion per prompt."""

    def __init__(self):
        self.prompts = []

    def generate(self, requests):
        self.prompts += [r.prompt for r in requests]
        return [Generation("<Ada Lovelace; wrote; first program>\n<Marie Curie; discovered; polonium>", [1], [-0.25],
                           10, "stop") for _ in requests]


def test_generator_extractor_prompts_per_passage_and_refuses_overlong_passages():
    fake = _FakeGenerator()
    x = GeneratorTripletExtractor(fake, "fake", max_passage_chars=100)
    [ex] = x.extract([Passage("p", "Ada Lovelace", "Ada Lovelace wrote the first program.")])
    # the second line (the prompt's example, not in this passage) is dropped as ungrounded
    assert [(t.head, t.relation, t.tail, t.sentence) for t in ex.triplets] == [
        ("Ada Lovelace", "wrote", "first program", 0)]
    assert "<head; relation; tail>" in fake.prompts[0] and "Ada Lovelace wrote the first program." in fake.prompts[0]
    with pytest.raises(ValueError, match="over the extractor's limit"):
        x.extract([Passage("q", "", "x" * 101)])


# --- the Beam job -------------------------------------------------------------------------

CORPUS = [
    {"id": "curie", "title": "Marie Curie", "text": "Marie Curie discovered radium and polonium. "
                                                    "She was born in Warsaw."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "empty", "title": "Greeting", "text": "Hello there!"},
    {"id": "long", "title": "Long", "text": "A very long passage. " * 40},  # over --max-chars: fails alone
    {"id": "notext", "title": "Broken", "text": None},  # invalid row: rejected by validation
]


def _corpus(path):
    pq.write_table(pa.Table.from_pylist(CORPUS), path)
    return str(path)


def _rows(folder, name):
    return [r for f in sorted(folder.glob(f"{name}-*.parquet")) for r in pq.read_table(f).to_pylist()]


@pytest.mark.slow
def test_extract_triplets_job_writes_sets_dead_letters_and_resumes(tmp_path):
    corpus = _corpus(tmp_path / "corpus.parquet")
    out = tmp_path / "triplets"
    config = ExtractorConfig(max_chars=200)
    manifest = run_extract_triplets(ExtractJob(corpus, str(out), config, batch_size=8))
    store = TripletStore.open(str(out))
    assert [(t.head, t.relation, t.tail, t.sentence) for t in store["curie"]] == [
        ("Marie Curie", "discovered", "radium", 0), ("Marie Curie", "discovered", "polonium", 0),
        ("Marie Curie", "was born in", "Warsaw", 1)]
    assert [(t.head, t.relation, t.tail) for t in store["paris"]] == [("Paris", "is", "capital of France")]
    assert store["empty"] == ()  # finished, no triplet
    with pytest.raises(KeyError, match="no extracted triplet set"):
        store["long"]
    dead = {r["id"]: r for r in _rows(out, "dead_letters")}
    assert set(dead) == {"long", "notext"}
    assert dead["long"]["stage"] == "extract" and "--max-chars" in dead["long"]["message"]
    assert dead["notext"]["stage"] == "validate"
    assert json.loads(dead["long"]["raw"])["title"] == "Long"  # replayable input
    assert {r["extractor"] for r in _rows(out, "triplets")} == {"spacy-rules"}
    assert (manifest["passages"], manifest["dead_letters"], manifest["triplets"]) == (3, 2, 4)
    assert manifest["passages_without_triplets"] == 1 and manifest["passages_per_s"] > 0

    # an existing output is refused without --resume/--overwrite; a resume redoes nothing
    with pytest.raises(ValueError, match=r"already holds an earlier run \(extracted triplets, dead letters, a manifest"):
        run_extract_triplets(ExtractJob(corpus, str(out), config))
    # a killed run's triplets shard without its extracted twin is no commit: removed on resume
    (out / "triplets-99999999999999999999-deadbeef.parquet").write_bytes(
        (next(out.glob("triplets-*.parquet"))).read_bytes())
    # the resumed attempt retries the two failed rows only; both fail again: 100% of this
    # attempt's rows, but 2 of the run's 5, under --max-failure-fraction
    from specrag.pipelines.extract_triplets import ExtractionFailed
    again = run_extract_triplets(ExtractJob(corpus, str(out), config, resume=True))
    assert again["passages"] == 0 and again["resumed"]["skipped_finished"] == 3
    run = again["over_the_run"]
    assert (run["passages"], run["dead_letters"]) == (3, 2)
    assert run["reconciliation"] == {"input_rows": 5, "results": 3, "dead_letters": 2, "unreadable_files": 0,
                                     "lost": 0, "duplicated": 0}
    with pytest.raises(ExtractionFailed, match="2 of 5 passages ended as dead letters .* over every attempt of the run"):
        run_extract_triplets(ExtractJob(corpus, str(out), config, resume=True, max_failure_fraction=0.3))
    assert not (out / "triplets-99999999999999999999-deadbeef.parquet").exists()
    assert TripletStore.open(str(out)).sets == store.sets
    # a resume with other extractor settings is refused, naming the difference
    with pytest.raises(ValueError, match="max_chars: 200 -> 300"):
        run_extract_triplets(ExtractJob(corpus, str(out), ExtractorConfig(max_chars=300), resume=True))


@pytest.mark.slow
def test_extract_triplets_job_on_a_non_local_scheme(tmp_path):
    root = tmp_path / "bucket"
    root.mkdir()
    remotefs.ROOT["path"] = str(root)
    try:
        _corpus(root / "corpus.parquet")
        manifest = run_extract_triplets(ExtractJob("specragtest://corpus.parquet", "specragtest://out",
                                                   ExtractorConfig(max_chars=200)))
        assert manifest["passages"] == 3 and (root / "out" / "manifest.json").exists()
        store = TripletStore.open("specragtest://out")
        assert len(store) == 3 and store.fingerprint == manifest["fingerprint"]
    finally:
        remotefs.ROOT["path"] = None


@pytest.mark.slow
def test_extract_triplets_job_with_the_generator_as_extractor(tmp_path):
    """The paper's way on the real generator: every kept triplet is grounded in its passage
    and carries the mean log-probability of its line."""
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(CORPUS[:2]), corpus)
    out = tmp_path / "out"
    config = ExtractorConfig(extractor="generator", model="smollm2-135m-instruct", max_new_tokens=48)
    manifest = run_extract_triplets(ExtractJob(str(corpus), str(out), config))
    assert manifest["passages"] == 2 and manifest["dead_letters"] == 0
    assert manifest["identity"]["model"].startswith("smollm2-135m-instruct")
    store = TripletStore.open(str(out))
    texts = {r["id"]: f"{r['title']} {r['text']}".lower() for r in CORPUS[:2]}
    for pid, triplets in store.sets.items():
        for t in triplets:
            assert t.head.lower() in texts[pid] and t.tail.lower() in texts[pid]
            assert t.score is not None and t.score <= 0
    assert {r["extractor"] for r in _rows(out, "triplets")} <= {"generator"}


def test_extract_triplets_cli_checks_its_options(tmp_path, capsys):
    from specrag.pipelines.cli import main
    assert main(["extract-triplets", "--output", str(tmp_path)]) == 2
    assert "needs --corpus" in capsys.readouterr().err
    assert main(["extract-triplets", "--corpus", "c.parquet", "--output", str(tmp_path),
                 "--extractor", "magic"]) == 2
    assert "unknown triplet extractor 'magic'" in capsys.readouterr().err
    assert main(["extract-triplets", "--corpus", "c.parquet", "--output", str(tmp_path),
                 "--extractor", "generator"]) == 2
    assert "needs --model generator=NAME" in capsys.readouterr().err
