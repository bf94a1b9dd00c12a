"""Knowledge triplets (head; relation; tail) of corpus passages: AED-RAG's second granularity.

A passage's triplet set is extracted once, offline, for the whole corpus (``specrag
extract-triplets``); at answer time AED-RAG maps each retrieved passage to its set
(``TripletStore``) and treats the set as one candidate unit (the paper's T_i = Ψ(d_i)).
Two extractors share one interface (``extract(passages) -> one Extraction per passage``):
dependency rules over spaCy parses (triplet_rules.py, the default) and a generator prompted
for ``<head; relation; tail>`` lines, the paper's way (TRACE prompts an 8B model), here
parsed by ``parse_triplet_lines``. Both normalise and deduplicate per passage.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import pyarrow as pa

ARTICLES = ("a ", "an ", "the ")
MAX_WORDS = 16  # a head or tail longer than this is a clause, not an entity: dropped


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Triplet:
    head: str
    relation: str
    tail: str
    sentence: int | None = None  # index of the passage sentence it came from, where known
    score: float | None = None  # the extractor's confidence, where it has one

    def line(self) -> str:
        return f"<{self.head}; {self.relation}; {self.tail}>"

    def key(self) -> tuple[str, str, str]:
        return self.head.lower(), self.relation.lower(), self.tail.lower()


@dataclass(frozen=True)
class Extraction:
    """A passage's triplet set (possibly empty) and how many sentences it read."""

    triplets: tuple[Triplet, ...]
    sentences: int


_SPACE = re.compile(r"\s+")
_EDGE = " \t\n\"'`,;:.!?()[]{}<>"


def clean_element(text: str, *, strip_article: bool) -> str:
    """One whitespace between words, no quotes or punctuation at the ends, no leading article."""
    text = _SPACE.sub(" ", text).strip(_EDGE)
    if strip_article:
        low = text.lower()
        for article in ARTICLES:
            if low.startswith(article):
                text = text[len(article):].strip(_EDGE)
                break
    return text


def normalise(triplets: Sequence[Triplet]) -> list[Triplet]:
    """Cleaned, without empty, self-referential, overlong or repeated triplets (first kept)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for t in triplets:
        head = clean_element(t.head, strip_article=True)
        tail = clean_element(t.tail, strip_article=True)
        relation = clean_element(t.relation, strip_article=False).lower()
        if not head or not tail or not relation or head.lower() == tail.lower():
            continue
        if len(head.split()) > MAX_WORDS or len(tail.split()) > MAX_WORDS or len(relation.split()) > MAX_WORDS:
            continue
        clean = Triplet(head, relation, tail, t.sentence, t.score)
        if clean.key() not in seen:
            seen.add(clean.key())
            out.append(clean)
    return out


def format_triplet_set(triplets: Sequence[Triplet]) -> str:
    """A triplet set as one text unit (what the predictor scores and the reader reads)."""
    return "\n".join(t.line() for t in triplets)


# --- the generator as extractor (the paper's way) ---------------------------------------

# Few-shot, completed as plain text (no chat template) and primed with "<": a small instruct
# model then keeps to the line format. Its copies of the example are removed by grounding.
TRIPLET_PROMPT = (
    "Extract knowledge triplets from the passage. Write one triplet per line as <head; relation; tail>.\n\n"
    "Passage: Marie Curie was born in Warsaw. She discovered polonium in 1898.\n"
    "Triplets:\n<Marie Curie; was born in; Warsaw>\n<Marie Curie; discovered; polonium>\n"
    "<polonium; was discovered in; 1898>\n\n"
    "Passage: {title}{text}\nTriplets:\n")
_LINE = re.compile(r"<([^<>;]+);([^<>;]+);([^<>]+)>")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def split_sentences(text: str) -> list[str]:
    """A light sentence splitter, for locating a generated triplet in its passage."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def sentence_of(head: str, tail: str, sentences: Sequence[str]) -> int | None:
    """The first sentence naming both ends (else the tail, else the head), or None."""
    low = [s.lower() for s in sentences]
    for needles in ((head.lower(), tail.lower()), (tail.lower(),), (head.lower(),)):
        for i, s in enumerate(low):
            if all(n in s for n in needles):
                return i
    return None


def parse_triplet_lines(output: str, passage_text: str = "",
                        line_scores: Sequence[float | None] | None = None, *, grounded_in: str | None = None
                        ) -> list[Triplet]:
    """``<head; relation; tail>`` lines of a generation → triplets (other text is ignored).

    ``line_scores`` (one per output line) become the triplets' scores. With ``grounded_in``,
    a triplet whose head or tail that text does not contain is dropped (a generator's
    invention, or its copy of the prompt's example)."""
    sentences = split_sentences(passage_text) if passage_text else []
    source = grounded_in.lower() if grounded_in is not None else None
    found = []
    for n, line in enumerate(output.splitlines()):
        for m in _LINE.finditer(line):
            head, relation, tail = (g.strip() for g in m.groups())
            score = line_scores[n] if line_scores is not None and n < len(line_scores) else None
            found.append(Triplet(head, relation, tail, sentence_of(head, tail, sentences), score))
    found = normalise(found)
    if source is not None:
        found = [t for t in found if t.head.lower() in source and t.tail.lower() in source]
    return found


def line_logprobs(token_ids: Sequence[int], token_logprobs: Sequence[float],
                  detokenize: Callable[[list[list[int]]], list[str]]) -> list[float | None]:
    """Mean token log-probability of each line of a generation (the line a token ends in)."""
    if not token_ids:
        return []
    prefixes = detokenize([list(token_ids[:i + 1]) for i in range(len(token_ids))])
    per_line: dict[int, list[float]] = {}
    for text, lp in zip(prefixes, token_logprobs):
        line = text.count("\n") - (1 if text.endswith("\n") else 0)
        per_line.setdefault(line, []).append(float(lp))
    lines = max(per_line) + 1
    return [sum(per_line[i]) / len(per_line[i]) if per_line.get(i) else None for i in range(lines)]


class GeneratorTripletExtractor:
    """The generator prompted for triplet lines (greedy), locally or through Triton.

    ``backend`` is a model backend serving generate (tokenize, to prime the answer with "<";
    detokenize, for per-line scores). Only triplets whose ends occur in the passage are kept."""

    name = "generator"

    @classmethod
    def from_config(cls, config, load_backend) -> "GeneratorTripletExtractor":
        """From an ExtractorConfig; ``load_backend(kind, model, threads, configs=...)`` gives the
        process's one backend for the generator."""
        backend = load_backend(config.backend, config.model, config.num_threads, configs=config.backend_configs)
        return cls(backend, config.model, max_new_tokens=config.max_new_tokens, max_passage_chars=config.max_chars)

    def __init__(self, backend, model: str, max_new_tokens: int = 160, max_passage_chars: int = 2000):
        self.backend, self.model = backend, model
        self.max_new_tokens, self.max_passage_chars = max_new_tokens, max_passage_chars
        tokenize = getattr(backend, "tokenize", None)
        self.prime = "<" if tokenize else ""
        self.prime_ids = tuple(tokenize(["<"])[0]) if tokenize else ()

    def extract(self, passages: Sequence[Passage]) -> list[Extraction]:
        from specrag.inference.types import GenerateRequest
        for p in passages:
            if len(p.text) > self.max_passage_chars:
                raise ValueError(f"passage {p.id!r} has {len(p.text)} characters, over the extractor's "
                                 f"limit of {self.max_passage_chars}")
        requests = [GenerateRequest(TRIPLET_PROMPT.format(title=f"{p.title}. " if p.title else "", text=p.text),
                                    max_new_tokens=self.max_new_tokens, stop=("\n\n",), chat=False,
                                    continuation_ids=self.prime_ids) for p in passages]
        outputs = self.backend.generate(requests)
        detok = getattr(self.backend, "detokenize", None)
        result = []
        for p, g in zip(passages, outputs):
            scores = line_logprobs(g.token_ids, g.token_logprobs, detok) if detok else None
            found = parse_triplet_lines(self.prime + g.text, p.text, scores, grounded_in=f"{p.title}\n{p.text}")
            result.append(Extraction(tuple(found), len(split_sentences(p.text))))
        return result


# --- the store AED-RAG reads ----------------------------------------------------------------

TRIPLETS = pa.schema([
    pa.field("passage_id", pa.string(), nullable=False),
    pa.field("sentence", pa.int32()),
    pa.field("head", pa.string(), nullable=False),
    pa.field("relation", pa.string(), nullable=False),
    pa.field("tail", pa.string(), nullable=False),
    pa.field("extractor", pa.string(), nullable=False),
    pa.field("score", pa.float64()),
])

# one row per passage the job finished: tells "no triplet" apart from "not extracted"
EXTRACTED = pa.schema([
    pa.field("passage_id", pa.string(), nullable=False),
    pa.field("sentences", pa.int32()),
    pa.field("triplets", pa.int32()),
])


class TripletStore:
    """Passage id → its triplet set, loaded from an ``extract-triplets`` output folder.

    A passage the job finished with no triplet maps to an empty set; one it never saw raises
    KeyError (a mismatched corpus shows at once instead of as silently empty units)."""

    def __init__(self, sets: dict[str, tuple[Triplet, ...]], fingerprint: str | None = None):
        self.sets = sets
        self.fingerprint = fingerprint

    @classmethod
    def open(cls, folder: str) -> "TripletStore":
        """Reads committed shards only (an extracted-S file and its triplets-S twin); a passage
        written twice (a retried bundle) keeps its first shard's set."""
        import json
        from specrag.jobio import files  # FileSystems paths
        done_files = sorted(files.match_files(files.join(folder, "extracted-*.parquet")))
        if not done_files:
            raise FileNotFoundError(f"{folder} holds no extract-triplets output (extracted-*.parquet)")
        sets: dict[str, tuple[Triplet, ...]] = {}
        for done in done_files:
            shard = done.rsplit("/", 1)[-1][len("extracted-"):-len(".parquet")]
            ids = files.read_parquet(done, columns=["passage_id"]).column("passage_id").to_pylist()
            new = {pid for pid in ids if pid not in sets}
            found: dict[str, list[Triplet]] = {pid: [] for pid in new}
            table = files.read_parquet(files.join(folder, f"triplets-{shard}.parquet"))
            for row in table.to_pylist():  # written in passage order, sentence order within
                if row["passage_id"] in found:
                    found[row["passage_id"]].append(
                        Triplet(row["head"], row["relation"], row["tail"], row["sentence"], row["score"]))
            sets.update({pid: tuple(ts) for pid, ts in found.items()})
        fingerprint = None
        if files.exists(files.join(folder, "manifest.json")):
            fingerprint = json.loads(files.read_text(files.join(folder, "manifest.json"))).get("fingerprint")
        return cls(sets, fingerprint)

    def __len__(self) -> int:
        return len(self.sets)

    def __getitem__(self, passage_id: str) -> tuple[Triplet, ...]:
        try:
            return self.sets[passage_id]
        except KeyError:
            raise KeyError(f"passage {passage_id!r} has no extracted triplet set: was the triplet folder "
                           "made from the index's corpus?") from None


class TripletResource:
    """AED-RAG's triplet sets as a method resource (``registry.RESOURCES["triplets"]``): the run's
    ``--triplets`` folder, written by `specrag extract-triplets` over the index's corpus."""

    folder_field = "triplets_dir"
    missing = "reads triplet sets: pass --triplets (built from the index's corpus by `specrag extract-triplets`)"

    @classmethod
    def check(cls, folder: str, runtime) -> None:
        from specrag.jobio.run_folder import read_manifest
        read_manifest(folder, "triplet folder", "specrag extract-triplets")

    @classmethod
    def open(cls, folder: str, runtime) -> TripletStore:
        return TripletStore.open(folder)

    @classmethod
    def identity_extras(cls, folder: str | None, runtime) -> dict:
        return {}
