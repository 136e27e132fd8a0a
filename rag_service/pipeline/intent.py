"""IntentParser: what a question asks, read by rules first (fast, deterministic).

Output: the query type, entities (identifiers, quoted phrases, numbers, named things), time
ranges resolved against "now", sub-questions, complexity, an ambiguity score with the missing
pieces, and, when the question cannot be answered without more input, the questions to ask back.
Follow-ups in a conversation have their references ("it", "their", "that document") resolved
from the previous turn before anything else reads them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from rag_service.domain import Complexity, Entities, Intent, QueryType, TimeRangeModel, Turn
from rag_service.pipeline.retrieval.query_analysis import content_words, extract_patterns, split_subqueries
from rag_service.pipeline.timeexpr import extract_time_ranges

# Below this confidence the rules are unsure what a question asks: the router then acts on no guessed
# type (only guidelines that ask back apply, else the fallback), and an LLM, when configured, is asked.
RULES_UNSURE_BELOW = 0.5
_CHIT_CHAT = re.compile(
    r"^\s*((hi|hello|hey|yo|good (morning|afternoon|evening))( there| all| everyone| team)?|thanks?( you)?( so much)?|"
    r"thank you|cheers|bye|goodbye|how are you( doing)?|who are you|what are you|what can you do|"
    r"tell me a joke|lol|ok(ay)?|cool|nice)\b[\s!.?,]*$", re.I)
_COMPARISON = re.compile(r"\b(compare|comparison|versus|vs\.?|differen(ce|ces|t)|differ|better than|worse than|"
                         r"pros and cons|trade-?offs?|contrast)\b", re.I)
_SUMMARY = re.compile(r"\b(summar(y|ise|ize|ies)|overview|tl;?dr|outline|main points|key points|gist|recap)\b", re.I)
_TEMPORAL = re.compile(r"\b(when|latest|most recent|recently|newest|history|timeline|changed|since|until|"
                       r"before|after)\b", re.I)
_STEPS = re.compile(r"\b(step[- ]by[- ]step|steps to|and then|after that|first .* then)\b", re.I)
_LOOKUP = re.compile(r"^\s*(find|look ?up|show( me)?|get|search( for)?|where is|which document)\b", re.I)
_PRONOUN = re.compile(r"\b(it|its|they|them|their|theirs|this|that|these|those|he|she|his|her)\b", re.I)
_DEMONSTRATIVE_NOUN = re.compile(r"\b(that|this|the same|the previous|the last)\s+(document|doc|file|one|error|"
                                 r"issue|report|article|page|section|paper|study)\b", re.I)
_VAGUE = re.compile(r"\b(stuff|things?|something|whatever|etc|the thing)\b", re.I)
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:[.,]\d+)?%?(?![\w-])")
_SENTENCE_START_WORDS = frozenset({"What", "How", "Why", "When", "Where", "Which", "Who", "Is", "Are", "Does",
                                   "Do", "Can", "Could", "Should", "Compare", "Summarize", "Summarise", "Tell",
                                   "Give", "Show", "Find", "List", "Explain", "Describe", "The", "A", "An", "In"})


_TOKEN = re.compile(r"[A-Za-z][\w'-]*|[.?!;:,]")


def _names(text: str, exclude: set[str]) -> list[str]:
    """Runs of capitalised words that do not merely start a sentence, plus acronyms and CamelCase."""
    names: list[str] = []
    run: list[str] = []
    sentence_start = True

    def flush() -> None:
        if run:
            name = " ".join(run)
            if name not in exclude and name not in names:
                names.append(name)
            run.clear()

    for token in _TOKEN.findall(text):
        if token in ".?!;:":
            flush()
            sentence_start = True
            continue
        if token == ",":
            flush()
            continue
        special = bool(re.fullmatch(r"[A-Z]{2,}\w*|[A-Z][a-z]+[A-Z]\w*|[a-z]+[A-Z]\w*", token))
        capitalised = token[0].isupper() and (not sentence_start or special) and token not in _SENTENCE_START_WORDS
        if capitalised or (run and token[0].isupper()):
            run.append(token)
        else:
            flush()
        sentence_start = False
    flush()
    return names


def extract_entities(text: str, time_expressions: Sequence[str] = ()) -> Entities:
    patterns = extract_patterns(text)
    identifiers = [p.text for p in patterns if p.kind == "identifier"]
    quoted = [p.text for p in patterns if p.kind == "phrase"]
    unquoted = re.sub(r'"[^"]*"', " ", text)
    for expression in time_expressions:
        unquoted = unquoted.replace(expression, " ")
    names = _names(unquoted, set(identifiers))
    numbers = [n for n in _NUMBER.findall(unquoted) if n not in identifiers]
    return Entities(identifiers=identifiers, quoted=quoted, numbers=numbers, names=names)


_POSSESSIVE = frozenset({"its", "their", "theirs", "his", "her"})
_DEMONSTRATIVE = frozenset({"this", "that", "these", "those"})
# "that is", "this year": a clause or a time, not a reference ("that document" is _DEMONSTRATIVE_NOUN's).
_NOT_A_REFERENCE = re.compile(r"\s+(is|was|are|were|year|week|month|quarter|day|one|document|time)\b", re.I)
# "Is it possible to...", "it's worth...": "it" holding the subject's place, pointing at nothing.
_PLACEHOLDER_IT = re.compile(r"it(\s+(is|was)|'s)?\s+(possible|true|necessary|important|better|best|safe|ok|okay|"
                             r"worth|hard|easy|normal|common|required|recommended|likely|feasible|enough)\b", re.I)
_BE = frozenset({"is", "are", "was", "were", "s"})
_LETTERS = re.compile(r"[A-Za-z]+")


def dangling_references(question: str) -> list[str]:
    """The pronouns in a question that point outside it (at a previous turn the question does not
    have): "How does it work?", "Who wrote that?", "this hymn". Not one with an antecedent in the
    question ("When did Victoria enact its constitution?": a name before it; "Who may not require
    that its teachers be certified?": a possessive after the asked-for subject), nor "that" as a
    conjunction or relative pronoun (after a content word, with a clause after it), nor "this week",
    "that is" or the placeholder "it" of "Is it possible...". Names are read from capitals, so a
    question in lower case (or all capitals) has none."""
    words = list(_LETTERS.finditer(question))
    tokens = [m.group(0).lower() for m in words]
    cased = question != question.upper()
    dangling = []
    for i, match in enumerate(words):
        low = tokens[i]
        if not _PRONOUN.fullmatch(low):
            continue
        if low in _DEMONSTRATIVE:
            if _NOT_A_REFERENCE.match(question, match.end()):
                continue
            # After a question word, verb or preposition "that" is a reference ("what is that",
            # "about that"); after a content word and before a clause, a conjunction or relative.
            if low == "that" and i and content_words(tokens[i - 1]) and len(tokens) - i > 2:
                continue
        else:
            if low == "it" and _PLACEHOLDER_IT.match(question, match.start()):
                continue
            names = [n for n in _names(question[:match.start()], set()) if n.split("'")[0] != "I"] if cased else []
            asked_subject = (low in _POSSESSIVE and len(tokens) > i >= 2 and tokens[0] in ("who", "which")
                             and tokens[1] not in _BE)
            if names or asked_subject:
                continue
        dangling.append(match.group(0))
    return dangling


def resolve_references(question: str, history: Sequence[Turn]) -> tuple[str, dict[str, str]]:
    """Replace pronouns and "that document"-style references with the previous turn's subject."""
    subject = next((t.subject for t in reversed(history) if t.subject), None)
    if not subject:
        return question, {}
    resolved: dict[str, str] = {}

    def demonstrative(m: re.Match[str]) -> str:
        resolved[m.group(0)] = subject
        return subject

    text = _DEMONSTRATIVE_NOUN.sub(demonstrative, question)

    def pronoun(m: re.Match[str]) -> str:
        word = m.group(0)
        low = word.lower()
        # Only as a standalone reference ("what about that?"), not "that is" / "this year".
        if low in _DEMONSTRATIVE and _NOT_A_REFERENCE.match(text, m.end()):
            return word
        replacement = f"{subject}'s" if low in _POSSESSIVE else subject
        resolved[word] = replacement
        return replacement

    text = _PRONOUN.sub(pronoun, text)
    return text, resolved


class IntentParser:
    """Rule-based parser. ``ambiguity_threshold``: at or above it the pipeline asks back."""

    def __init__(self, ambiguity_threshold: float = 0.6) -> None:
        if not 0 < ambiguity_threshold <= 1:
            raise ValueError("ambiguity_threshold must be in (0, 1]")
        self.ambiguity_threshold = ambiguity_threshold

    def parse(self, question: str, now: datetime, history: Sequence[Turn] = ()) -> Intent:
        original = question
        question, resolved = resolve_references(question, history) if history else (question, {})
        ranges = [TimeRangeModel(expression=r.expression, start=r.start, end=r.end)
                  for r in extract_time_ranges(question, now)]
        entities = extract_entities(question, [r.expression for r in ranges])
        subs = split_subqueries(question)
        words = content_words(question)
        query_type, confidence = self._type(question, entities, ranges, subs, words)
        # Without a conversation, the pronouns nothing in the question resolves (with one, resolved above).
        dangling = [] if history else dangling_references(question)
        missing, clarifications = self._gaps(question, query_type, entities, words, dangling, history)
        ambiguity = self._ambiguity(query_type, words, missing, dangling)
        if ambiguity < self.ambiguity_threshold:
            clarifications = []
        complexity = self._complexity(question, query_type, subs, entities, words)
        return Intent(question=question, original=original, query_type=query_type, entities=entities,
                      time_ranges=ranges, sub_questions=subs, complexity=complexity, ambiguity=round(ambiguity, 3),
                      missing=missing, clarifications=clarifications, resolved_references=resolved,
                      confidence=confidence, subject=entities.main() or " ".join(words[:4]) or None)

    @staticmethod
    def _type(question: str, entities: Entities, ranges: list[TimeRangeModel], subs: list[str],
              words: list[str]) -> tuple[QueryType, float]:
        """The query type by the first cue that fires (in precedence order), and a confidence
        computed from the cues: 1 / (number of types whose cues fire), so conflicting cues lower it
        (a question split into parts is sure: the other cues are its parts'); with no cue the question
        is factual by elimination, as sure as it has content words (two or more: sure; one: half; none:
        not at all)."""
        cues: list[QueryType] = []
        if _CHIT_CHAT.match(question) or (not words and not _PRONOUN.search(question)):
            cues.append("out_of_scope")
        if len(subs) >= 2 or _STEPS.search(question):
            cues.append("multi_step")
        if _COMPARISON.search(question):
            cues.append("comparison")
        if _SUMMARY.search(question):
            cues.append("summary")
        if ranges:
            cues.append("temporal")
        # "error E-4012", 'find "pool exhausted"': the identifier is the question. A question that
        # merely mentions one ("what does ef_search trade off?") is factual.
        if (entities.identifiers or entities.quoted) and (len(words) <= 3 or _LOOKUP.match(question)):
            cues.append("exact_lookup")
        if not ranges and _TEMPORAL.search(question):
            cues.append("temporal")
        if cues:
            distinct = list(dict.fromkeys(cues))
            if distinct[0] == "multi_step" and len(subs) >= 2:
                # Split into its parts, the question's other cues are its parts' own (a comparison in
                # one, a date in another): each part is retrieved for by itself, so they are no conflict.
                return "multi_step", 1.0
            return distinct[0], round(1 / len(distinct), 3)
        # Only stop words ("it?") gives 0: a bare reference that needs its subject.
        return "factual", round(min(1.0, len(words) / 2), 3)

    @staticmethod
    def _gaps(question: str, query_type: QueryType, entities: Entities, words: list[str],
              dangling: list[str], history: Sequence[Turn]) -> tuple[list[str], list[str]]:
        missing: list[str] = []
        asks: list[str] = []
        unresolved_reference = not history and (_DEMONSTRATIVE_NOUN.search(question) or (
            dangling and len(words) <= 3))
        if unresolved_reference:
            missing.append("what 'it'/'that' refers to")
            asks.append("Which document, product or topic do you mean?")
        if query_type == "comparison":
            things = entities.identifiers + entities.quoted + entities.names
            vs = re.split(r"\b(?:vs\.?|versus|and|or|with|to|from)\b", question, flags=re.I)
            if len(things) < 2 and len([p for p in vs if content_words(p)]) < 2:
                missing.append("the second thing to compare")
                asks.append("What should it be compared with?")
        framed = len(re.findall(r"[\w'-]+", question)) > len(words)  # "What is X?" asks something about X
        if query_type in ("factual", "temporal") and len(words) == 1 and not framed \
                and not (entities.identifiers or entities.quoted):
            missing.append("what you want to know about it")
            asks.append(f"What would you like to know about {words[0]}?")
        if _VAGUE.search(question) and len(words) <= 4:
            missing.append("a specific subject")
            asks.append("Could you name the specific subject or document?")
        return missing, asks

    @staticmethod
    def _ambiguity(query_type: QueryType, words: list[str], missing: list[str], dangling: list[str]) -> float:
        # Each missing piece weighs most; a very short question and an unresolved pronoun add doubt.
        score = 0.4 * len(missing)
        if len(words) <= 2 and query_type != "out_of_scope":
            score += 0.2
        if dangling:
            score += 0.2
        return min(score, 1.0)

    @staticmethod
    def _complexity(question: str, query_type: QueryType, subs: list[str], entities: Entities,
                    words: list[str]) -> Complexity:
        things = len(entities.identifiers + entities.quoted + entities.names)
        sides = len([p for p in re.split(r"\b(?:vs\.?|versus)\b|,|\band\b|:", question, flags=re.I)
                     if content_words(p)])
        if query_type == "multi_step" or len(subs) >= 3 or (query_type == "comparison" and max(things, sides) >= 3):
            return "complex"
        if query_type in ("comparison", "summary", "temporal") or len(words) > 12:
            return "moderate"
        return "simple"
