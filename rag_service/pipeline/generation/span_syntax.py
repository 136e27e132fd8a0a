"""What a sentence's parse says about a short-answer candidate (pure): whether it is a named
entity of the type the question asks for, where it sits in the dependency tree relative to the
question's words, and whether it fills the role the question's wh-word fills ("Who [subject]
founded ...?" is answered by the sentence's subject).

These are the classic features of feature-based readers (Rajpurkar et al. 2016, "SQuAD", section
5: dependency-tree paths between the candidate and the question's words, lexicalised by the
question's wh-word); the parse and the entities come from spaCy's small English pipeline
(providers/syntax.py). On XQuAD, with article-grouped cross-validation and the threshold the
training picks for exact match >= 0.60, they raise the share of questions given a short answer
from 18% to 34.7% (docs/benchmarks.md). At the ``entities`` depth (named entities only, no tree)
only the entity features are read (ENTITY_FEATURES): 27.4%, for about 40% of the parse's CPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rag_service.domain import Entity, Parsed
from rag_service.text.questions import Focus
from rag_service.text.terms import terms

SYNTAX_FEATURES = ("entity", "entity_match", "entity_mismatch", "noun_chunk", "tree_distance", "subject",
                   "object", "head_is_anchor", "wh_role", "verb_match", "syntax_only")
# What a parse without the tree (the "entities" depth) still says.
ENTITY_FEATURES = ("entity", "entity_match", "entity_mismatch", "syntax_only")
# The OntoNotes entity types that answer each kind of question the wording asks (questions.py).
ENTITY_TYPES = {
    "person": frozenset({"PERSON", "ORG", "NORP"}),
    "place": frozenset({"GPE", "LOC", "FAC"}),
    "date": frozenset({"DATE", "TIME"}),
    "number": frozenset({"CARDINAL", "QUANTITY", "MONEY", "PERCENT"}),
    "name": frozenset({"ORG", "WORK_OF_ART", "EVENT", "PRODUCT", "LAW", "NORP", "PERSON", "GPE", "FAC", "LOC"}),
}
NAME_TYPES = frozenset({"PERSON", "ORG", "GPE", "LOC", "FAC", "NORP", "EVENT", "WORK_OF_ART", "PRODUCT", "LAW",
                        "LANGUAGE"})
_SUBJECT = frozenset({"nsubj", "nsubjpass"})
_OBJECT = frozenset({"dobj", "pobj", "attr", "appos", "npadvmod"})
# The wh-word's role and the candidate's, coarsened: "What did X found?" (dobj) is answered by an
# object or attribute, "In what city...?" (pobj) by a prepositional object or an adverbial.
_ROLE = {"nsubj": "subject", "nsubjpass": "subject", "dobj": "object", "attr": "object", "pobj": "oblique",
         "npadvmod": "oblique", "advmod": "oblique"}
_WH_TAGS = frozenset({"WP", "WDT", "WRB", "WP$"})
_FAR = 20  # tree distance when no question word is in the sentence


def entity_kind(label: str) -> str:
    """The span kind (spans.py) of an entity type."""
    if label in NAME_TYPES:
        return "name"
    return "date" if label in ("DATE", "TIME") else "number"


def entity_at(parsed: Parsed, start: int, end: int, text: str) -> Entity | None:
    """The entity that is this span: the same offsets, or one that covers it with the same words
    ("the Panthers" for "Panthers")."""
    for entity in parsed.entities:
        same = (entity.start, entity.end) == (start, end)
        if entity.start <= start and end <= entity.end and (
                same or terms(parsed.text[entity.start:entity.end]) == terms(text)):
            return entity
    return None


def wh_role(question: Parsed) -> str | None:
    """The coarse role of the question's wh-phrase ("which team" counts as the noun it modifies); None
    when there is none, or its role is none of subject, object and oblique."""
    for i, word in enumerate(question.words):
        if word.tag in _WH_TAGS:
            node = question.words[i] if word.tag in ("WP", "WRB") else question.words[word.head]
            return _ROLE.get(node.dep)
    return None


@dataclass(frozen=True)
class Reading:
    """What every candidate of one sentence shares, worked out once per question and sentence."""

    sentence: Parsed
    expected: frozenset[str] | None     # the entity types the question asks for
    matched: frozenset[int]             # the sentence's words that are question words
    role: str | None                    # the wh-word's role
    asked_verbs: frozenset[str]         # the stems of the question's verbs
    ancestors: tuple[tuple[int, ...], ...]  # each word's heads, nearest first
    tree: bool = True                   # False: the entity features alone (ENTITY_FEATURES)

    @property
    def features(self) -> tuple[str, ...]:
        return SYNTAX_FEATURES if self.tree else ENTITY_FEATURES


def has_tree(question: Parsed | None, sentence: Parsed) -> bool:
    """Whether the tree's features can be read: the question's parse is there, and the sentence's
    has its dependency arcs (neither at the entities depth)."""
    return question is not None and sentence.tree


def reading(question: Parsed | None, sentence: Parsed, asked: Focus) -> Reading:
    """``question``: its parse, which only the tree's features read (None at the entities depth)."""
    if question is None or not has_tree(question, sentence):
        return Reading(sentence=sentence, expected=ENTITY_TYPES.get(asked.kind or ""), matched=frozenset(),
                       role=None, asked_verbs=frozenset(), ancestors=(), tree=False)
    return Reading(
        sentence=sentence,
        expected=ENTITY_TYPES.get(asked.kind or ""),
        matched=frozenset(i for i, w in enumerate(sentence.words) if (t := terms(w.text)) and t[0] in asked.terms),
        role=wh_role(question),
        asked_verbs=frozenset(t[0] for w in question.words if w.pos == "VERB" and (t := terms(w.text))),
        ancestors=tuple(tuple(sentence.ancestors(i)) for i in range(len(sentence.words))),
    )


def _distance(read: Reading, a: int, b: int) -> int:
    depth = {w: n for n, w in enumerate((a, *read.ancestors[a]))}
    for n, w in enumerate((b, *read.ancestors[b])):
        if w in depth:
            return depth[w] + n
    return _FAR


def syntax_features(start: int, end: int, text: str, read: Reading, syntax_only: bool) -> dict[str, float]:
    """``read.features`` of the candidate at ``start``:``end`` of the sentence."""
    sentence = read.sentence
    entity = entity_at(sentence, start, end, text)
    expected = read.expected
    row = {
        "entity": float(entity is not None),
        "entity_match": float(entity is not None and expected is not None and entity.label in expected),
        "entity_mismatch": float(entity is not None and expected is not None and entity.label not in expected),
        "syntax_only": float(syntax_only),
    }
    if not read.tree:
        return row
    inside = [i for i, w in enumerate(sentence.words) if start <= w.start < end]
    root = min(inside, key=lambda i: len(read.ancestors[i])) if inside else None
    anchors = sorted(read.matched.difference(inside))
    dep = sentence.words[root].dep if root is not None else None
    heads = read.ancestors[root][:2] if root is not None else ()
    return row | {
        "noun_chunk": float(any(s <= start and end <= e for s, e in sentence.noun_chunks)),
        "tree_distance": math.log1p(min((_distance(read, root, a) for a in anchors), default=_FAR)
                                    if root is not None else _FAR),
        "subject": float(dep in _SUBJECT),
        "object": float(dep in _OBJECT),
        "head_is_anchor": float(any(h in anchors for h in heads)),
        "wh_role": float(read.role is not None and read.role == _ROLE.get(dep or "")),
        "verb_match": float(any(sentence.words[h].pos == "VERB" and (t := terms(sentence.words[h].text))
                                and t[0] in read.asked_verbs for h in heads)),
    }
