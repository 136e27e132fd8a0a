"""Short answers (pure, apart from loading the model's weights once): a span copied from the cited
sentence, of the kind the question asks for, or nothing.

Candidates are the sentence's numbers, dates, capitalised names (and lists of them), short runs
of content words, and (with its parse) its named entities and noun chunks, that the question does
not already state (never a pronoun: pronouns are stop words). A small logistic model
(``benchmarks/train_answerability.py``, trained on XQuAD with article-grouped cross-validation)
scores each from evidence that carries across collections: whether its kind is the one asked for,
how close it stands to the question's words in the sentence and how many of them surround it, how
much of the question the sentence holds, and how likely the passage is to answer at all. With the
sentence's parse (``RAGSVC_ANSWER_SHORT_ANSWER_PARSE=full``), a second model also reads whether its
entity type is the one asked for, how close it stands to the question's words in the dependency
tree and whether it fills the wh-word's role (span_syntax.py); with its named entities alone
(``=entities``), a third reads the entity features only. The best candidate is the short
answer only when its probability of being exactly the answer reaches the model's threshold:
precision first.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from functools import cache

import numpy as np

from rag_service.domain import Parsed, ParseDepth, Word
from rag_service.pipeline.generation.span_syntax import (
    ENTITY_FEATURES,
    SYNTAX_FEATURES,
    Reading,
    entity_kind,
    has_tree,
    reading,
    syntax_features,
)
from rag_service.providers.rerankers import LinearModel
from rag_service.providers.syntax import SyntaxParser
from rag_service.text.questions import Focus, focus, is_question, wants_clause
from rag_service.text.terms import STOP_WORDS, terms

FEATURES = ("kind_match", "kind_mismatch", "open_name", "open_number", "open_date", "open_phrase", "phrase",
            "distance", "after_anchor", "before_anchor", "between_anchors", "near", "overlap", "length",
            "first_of_kind", "kind_count", "sentence_share", "answerable", "starts_sentence")
PARSED_FEATURES = (*FEATURES, *SYNTAX_FEATURES)
ENTITIES_MODEL_FEATURES = (*FEATURES, *ENTITY_FEATURES)
MODEL_FILE = "short_answer.json"
PARSED_MODEL_FILE = "short_answer_parsed.json"
ENTITIES_MODEL_FILE = "short_answer_entities.json"
# (model file, its features) for each parse depth; None: without a parse.
SHORT_ANSWER_MODELS: dict[ParseDepth | None, tuple[str, tuple[str, ...]]] = {
    None: (MODEL_FILE, FEATURES),
    "entities": (ENTITIES_MODEL_FILE, ENTITIES_MODEL_FEATURES),
    "full": (PARSED_MODEL_FILE, PARSED_FEATURES),
}
# The question's parse (None at the entities depth, where only the sentence's entities are read)
# and the best sentence's.
ShortAnswerParse = tuple[Parsed | None, Parsed]

_SCALE = r"(?:\s?(?:%|percent|million|billion|trillion|thousand|hundred))"
_UNIT = (r"(?:\s(?:seconds?|minutes?|hours?|days?|weeks?|months?|years?|km|kilometers?|kilometres?|miles?|"
         r"meters?|metres?|feet|foot|inches|kg|kilograms?|pounds?|tons?|tonnes?|acres?|hectares?|degrees?))")
_NUMBER_WORDS = (r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
                 r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|hundred|thousand|dozen)")
_NUMBER = re.compile(rf"(?:\$|€|£)?\b\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?{_SCALE}?"
                     rf"(?:{_UNIT}|\s?°\s?[CF])?|\b{_NUMBER_WORDS}\b(?:{_SCALE})?{_UNIT}?", re.I)
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_DATE = re.compile(rf"\b(?:{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}|\d{{1,2}}\s+{_MONTH}\s+\d{{4}}"
                   rf"|{_MONTH}\s+\d{{4}}|(?:1[0-9]|20)\d{{2}}s?)\b")
_CAPITAL = r"[A-Z][\w'.-]*"
_NAME = re.compile(rf"\b{_CAPITAL}(?:(?:\s+(?:of|the|de|von|van|der|del|for|du|la|and))*\s+{_CAPITAL})*")
_LIST = re.compile(rf"\b{_CAPITAL}(?:,\s+{_CAPITAL})+,?\s+and\s+{_CAPITAL}")
_WORD = re.compile(r"[\w'’-]+")
_JOINERS = frozenset({"of", "and"})
MAX_PHRASE_WORDS = 5
_KIND_OF = {"number": "number", "date": "date", "person": "name", "place": "name", "name": "name"}


@dataclass(frozen=True)
class Span:
    text: str
    kind: str   # number | date | name | phrase
    start: int  # offsets in the sentence
    end: int
    syntax_only: bool = False  # found by the parse alone (an entity or noun chunk the patterns miss)


def _clean(text: str) -> str:
    return re.sub(r"^(?:The|A|An)\s+", "", text.strip(" ,.;:'\""))


def candidates(sentence: str, question: str, parsed: Parsed | None = None) -> list[Span]:
    """The sentence's numbers, dates, names, lists of names and short content-word phrases that are
    not all question words, left to right (a date wins over a number or name inside it); with its
    parse, also its named entities and noun chunks (without a leading determiner or possessive)
    that the patterns did not find."""
    asked = set(terms(question))
    spans: list[Span] = []
    dates: list[tuple[int, int]] = []

    def add(kind: str, start: int, end: int, syntax_only: bool = False) -> None:
        text = _clean(sentence[start:end])
        words = terms(text)
        if len(text) < 2 or (kind != "number" and (not words or text.lower() in STOP_WORDS)):
            return
        if words and all(w in asked for w in words):
            return
        if kind == "number":
            # "How many minutes...?" is answered by the number: the question already names the unit.
            unit = re.search(r"\s([a-z]+)$", text)
            if unit and re.search(rf"\b{unit.group(1)}\b", question, re.I):
                text = text[: unit.start()]
        spans.append(Span(text, kind, start, end, syntax_only))

    for m in _DATE.finditer(sentence):
        if not re.fullmatch(r"\d{4}", m.group(0)):  # a bare year may also be a count ("about 1500 soldiers")
            dates.append((m.start(), m.end()))
        add("date", m.start(), m.end())
    for kind, pattern in (("number", _NUMBER), ("name", _LIST), ("name", _NAME)):
        for m in pattern.finditer(sentence):
            if any(s < m.end() and m.start() < e for s, e in dates):
                continue
            add(kind, m.start(), m.end())
            first = re.match(r"[\w'.-]+\s+", m.group(0))
            if kind == "name" and first and m.start() == 0:
                # A capital that only starts the sentence: "Then Anderson" is also "Anderson".
                add(kind, m.start() + first.end(), m.end())
    # Phrases: runs of content words the question does not use ("public sector corruption").
    run: list[re.Match[str]] = []
    for m in [*_WORD.finditer(sentence), None]:
        word = m.group(0).lower() if m else ""
        inside = m is not None and (word not in STOP_WORDS or (run and word in _JOINERS)) and not (
            terms(word) and terms(word)[0] in asked)
        if inside and (not run or sentence[run[-1].end():m.start()].strip() == "") and len(run) < MAX_PHRASE_WORDS:
            run.append(m)
            continue
        while run and run[-1].group(0).lower() in _JOINERS:
            run.pop()
        if run and any(w.group(0)[0].islower() for w in run):
            add("phrase", run[0].start(), run[-1].end())
        run = [m] if inside and word not in STOP_WORDS else []
    unique = {(s.text, s.kind): s for s in spans}
    if parsed is not None:
        # A span the patterns found already is kept as theirs: "the Carolina Panthers" (spaCy keeps
        # the article inside the entity) is the pattern's "Carolina Panthers".
        known = {_plain(s.text) for s in unique.values()}
        found = len(spans)
        for entity in parsed.entities:
            words = _without_lead([w for w in parsed.words if entity.start <= w.start < entity.end], chunk=False)
            if words:
                add(entity_kind(entity.label), words[0].start, entity.end, syntax_only=True)
        for start, end in parsed.noun_chunks:
            words = _without_lead([w for w in parsed.words if start <= w.start < end], chunk=True)
            if 0 < len(words) <= MAX_PHRASE_WORDS:
                add("phrase", words[0].start, end, syntax_only=True)
        for span in spans[found:]:
            if _plain(span.text) not in known:
                known.add(_plain(span.text))
                unique[(span.text, span.kind)] = span
    return sorted(unique.values(), key=lambda s: (s.start, s.end))


def _plain(text: str) -> str:
    return re.sub(r"^(?:the|a|an)\s+", "", text.lower())


def _without_lead(words: list[Word], chunk: bool) -> list[Word]:
    """The words of an entity or noun chunk from its first content word: without a leading
    article, "'s" or punctuation; a noun chunk also without a leading possessor or stop word
    ("[Denver's] defense"), where an entity keeps it ("Denver" is the entity of "Denver's").
    Without the tree (the entities depth) an article is known by its spelling."""
    while words and (words[0].dep in ("det", "case", "punct") or words[0].text[:1] in ("'", "’")
                     or (not words[0].dep and _article_or_punctuation(words[0].text))
                     or (chunk and (words[0].dep == "poss" or words[0].text.lower() in STOP_WORDS))):
        words = words[1:]
    return words


def _article_or_punctuation(word: str) -> bool:
    return word.lower() in ("the", "a", "an") or unicodedata.category(word[:1] or " ").startswith("P")


def span_features(span: Span, spans: list[Span], sentence: str, asked: Focus, answerable: float,
                  read: Reading | None = None) -> np.ndarray:
    """The candidate's features: FEATURES, or with the parse's ``read`` (span_syntax.reading, once
    per question and sentence) PARSED_FEATURES (ENTITIES_MODEL_FEATURES at the entities depth)."""
    words = [(m.start(), m.group(0)) for m in re.finditer(r"[\w'-]+", sentence)]
    anchors = [i for i, (_, w) in enumerate(words) if terms(w) and terms(w)[0] in asked.terms]
    inside = [i for i, (at, _) in enumerate(words) if span.start <= at < span.end]
    first, last = (inside[0], inside[-1]) if inside else (0, 0)
    outside = [a for a in anchors if a < first or a > last]
    distance = min((min(abs(a - first), abs(a - last)) for a in outside), default=len(words))
    window = {terms(words[a][1])[0] for a in outside if first - 6 <= a <= last + 6}
    span_terms = terms(span.text)
    expected = _KIND_OF.get(asked.kind or "")
    same_kind = [s for s in spans if s.kind == span.kind]
    sentence_terms = set(terms(sentence))
    row = {
        "kind_match": float(expected == span.kind),
        "kind_mismatch": float(expected is not None and expected != span.kind),
        "open_name": float(expected is None and span.kind == "name"),
        "open_number": float(expected is None and span.kind == "number"),
        "open_date": float(expected is None and span.kind == "date"),
        "open_phrase": float(expected is None and span.kind == "phrase"),
        "phrase": float(span.kind == "phrase"),
        "distance": math.log1p(distance),
        # Questions are often the sentence with the answer cut out: it follows the words they share.
        "after_anchor": float(any(0 < first - a <= 3 for a in outside)),
        # ... or it qualifies one of them ("remote [sensing]").
        "before_anchor": float(any(0 < a - last <= 2 for a in outside)),
        "between_anchors": float(any(a < first for a in outside) and any(a > last for a in outside)),
        "near": len(window) / len(asked.terms) if asked.terms else 0.0,
        "overlap": sum(t in asked.terms for t in span_terms) / len(span_terms) if span_terms else 0.0,
        "length": math.log1p(len(span.text.split())),
        "first_of_kind": float(same_kind[0] == span),
        "kind_count": 1.0 / len(same_kind),
        "sentence_share": len(asked.terms & sentence_terms) / len(asked.terms) if asked.terms else 0.0,
        "answerable": answerable,
        "starts_sentence": float(span.start <= 1),
    }
    if read is None:
        return np.array([row[f] for f in FEATURES], dtype=np.float64)
    # The parse is read at the candidate's own words: a pattern's match may hold a trailing "." or
    # "," or a leading "The " that the candidate's text dropped (and an entity would not cover);
    # a number keeps its unit here ("2,300 miles" is the entity, even when the answer is "2,300").
    raw = sentence[span.start:span.end]
    core = _clean(raw)
    at = raw.find(core) if core else -1
    start, end, text = ((span.start + at, span.start + at + len(core), core) if at >= 0
                        else (span.start, span.end, span.text))
    row |= syntax_features(start, end, text, read, span.syntax_only)
    return np.array([row[f] for f in (*FEATURES, *read.features)], dtype=np.float64)


@dataclass(frozen=True)
class ShortAnswerModel:
    weights: LinearModel
    threshold: float

    @classmethod
    @cache
    def default(cls, depth: ParseDepth | None = None) -> ShortAnswerModel:
        """The shipped model for a parse of this depth (None: the one that reads no parse)."""
        resource, features = SHORT_ANSWER_MODELS[depth]
        model = LinearModel.load(resource=resource, features=features)
        return cls(model, model.threshold if model.threshold is not None else 0.5)

    @classmethod
    def for_parse(cls, parsed: ShortAnswerParse | None) -> ShortAnswerModel:
        return cls.default(None if parsed is None else "full" if has_tree(*parsed) else "entities")

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        return self.weights.probabilities(rows)


def parse_for_short_answer(question: str, sentence: str, parser: SyntaxParser) -> ShortAnswerParse | None:
    """(question, sentence) parsed, or None for a question never given a short answer (it asks
    why or how something happened: its answer is a clause). At the entities depth only the
    sentence is parsed: nothing of the question's parse is read without the sentence's tree."""
    if wants_clause(question):
        return None
    return as_pair(parser.parse(texts_to_parse(question, sentence, parser.depth)))


async def parse_for_short_answer_async(question: str, sentence: str,
                                       parser: SyntaxParser) -> ShortAnswerParse | None:
    """``parse_for_short_answer`` on the parser's own thread."""
    if wants_clause(question):
        return None
    return as_pair(await parser.parse_async(texts_to_parse(question, sentence, parser.depth)))


def texts_to_parse(question: str, sentence: str, depth: ParseDepth) -> list[str]:
    return [sentence] if depth == "entities" else [question, sentence]


def as_pair(parses: list[Parsed]) -> ShortAnswerParse:
    """The parses of ``texts_to_parse``, as (question, sentence)."""
    return (None, parses[0]) if len(parses) == 1 else (parses[0], parses[1])


def scored_candidates(question: str, sentence: str, answerable: float = 1.0,
                      model: ShortAnswerModel | None = None,
                      parsed: ShortAnswerParse | None = None) -> list[tuple[Span, float]]:
    """Each candidate with its probability of being exactly the answer, best first (none for a
    question that asks why or how something happened: its answer is a clause). With ``parsed``
    (``parse_for_short_answer``), the parse's candidates too, scored by the model that reads it."""
    if wants_clause(question):
        return []
    spans = candidates(sentence, question, parsed[1] if parsed else None)
    if not spans:
        return []
    asked = focus(question)
    model = model or ShortAnswerModel.for_parse(parsed)
    read = reading(parsed[0], parsed[1], asked) if parsed else None
    rows = np.vstack([span_features(s, spans, sentence, asked, answerable, read) for s in spans])
    return sorted(zip(spans, model.probabilities(rows).tolist(), strict=True), key=lambda sp: -sp[1])


def short_answer(question: str, sentence: str, answerable: float = 1.0, model: ShortAnswerModel | None = None,
                 parsed: ShortAnswerParse | None = None) -> str | None:
    """The short answer from ``sentence``, or None when no candidate is likely enough, and for what
    is not asked as a question: keywords and statements do not say what kind of fact they want, and
    the spans picked for XQuAD's questions typed as keywords were exactly right 39% of the time."""
    if not is_question(question):
        return None
    model = model or ShortAnswerModel.for_parse(parsed)
    scored = scored_candidates(question, sentence, answerable, model, parsed)
    if scored and scored[0][1] >= model.threshold:
        return scored[0][0].text
    return None
