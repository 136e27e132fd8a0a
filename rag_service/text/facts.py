"""The checkable facts of a sentence (pure): numbers, dates, names and negation.

A claim can share almost every word with its source and still be wrong: another year, another
count, another name, or a "not". These are the tokens that carry such errors, normalised so that
"three" matches "3", "1,000" matches "1000" and "February" matches "Feb.". Scoring compares them
between an answer and the passage it rests on; nothing here knows any dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from rag_service.text.terms import STOP_WORDS, cache_short_texts, stem

FactKind = str  # "number" | "date" | "name"

# Words and numbers in any script; a number keeps its decimal point and thousands separators.
_TOKEN = regex.compile(r"\d+(?:[.,]\d+)*|\p{L}[\p{L}\p{M}'’-]*")
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90",
    "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
    "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th",
}
_MONTHS = {
    "january": "jan", "february": "feb", "march": "mar", "april": "apr", "may": "may", "june": "jun",
    "july": "jul", "august": "aug", "september": "sep", "october": "oct", "november": "nov", "december": "dec",
    "jan": "jan", "feb": "feb", "mar": "mar", "apr": "apr", "jun": "jun", "jul": "jul", "aug": "aug",
    "sep": "sep", "sept": "sep", "oct": "oct", "nov": "nov", "dec": "dec",
}
# "may" and "march" are also common words: only capitalised, or next to a number, are they months.
_AMBIGUOUS_MONTHS = {"may", "march"}
_WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
_NEGATIONS = {"not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without", "cannot", "nowhere",
              "kein", "nicht", "nie", "ne", "pas", "jamais", "nunca", "ningún", "ninguna", "sin", "non", "senza"}


@dataclass(frozen=True)
class Facts:
    """The checkable facts of one text."""

    numbers: frozenset[str]
    dates: frozenset[str]  # month names; years and days are numbers
    names: frozenset[str]  # lower-cased tokens of capitalised names
    negated: bool

    def of_kind(self, kind: FactKind) -> frozenset[str]:
        return {"number": self.numbers, "date": self.dates, "name": self.names}[kind]

    @property
    def count(self) -> int:
        return len(self.numbers) + len(self.dates) + len(self.names)

    def all(self) -> list[tuple[FactKind, str]]:
        return ([("number", n) for n in sorted(self.numbers)] + [("date", d) for d in sorted(self.dates)]
                + [("name", n) for n in sorted(self.names)])


def tokens(text: str) -> list[str]:
    """Words and numbers, as written."""
    return _TOKEN.findall(text)


def _number(token: str) -> str | None:
    if token[0].isdigit():
        # "1,000" and "1000" are one number, as are "1,000.50" and "1.000,50" (the separator that
        # comes last is the decimal one); "3,5" is a decimal comma.
        if "," in token and "." in token:
            decimal = "." if token.rfind(".") > token.rfind(",") else ","
            whole, _, fraction = token.rpartition(decimal)
            return whole.replace(",", "").replace(".", "") + "." + fraction
        if regex.fullmatch(r"\d{1,3}(?:,\d{3})+", token):
            return token.replace(",", "")
        return token.replace(",", ".")
    return _NUMBER_WORDS.get(token.lower())


@cache_short_texts(maxsize=16_384)
def facts(text: str) -> Facts:
    found = list(_TOKEN.finditer(text))
    words = [m.group(0) for m in found]
    numbers: set[str] = set()
    dates: set[str] = set()
    names: set[str] = set()
    negated = False
    for i, word in enumerate(words):
        low = word.lower()
        if low in _NEGATIONS or low.endswith(("n't", "n’t")):
            negated = True
        number = _number(word)
        if number is not None:
            numbers.add(number)
            continue
        if low in _MONTHS:
            near_number = any(w[0].isdigit() for w in words[max(0, i - 1):i + 2])
            if low not in _AMBIGUOUS_MONTHS or word[0].isupper() or near_number:
                dates.add(_MONTHS[low])
                continue
        if low in _WEEKDAYS:
            dates.add(low[:3])
            continue
        if word[0].isupper() and low not in STOP_WORDS and len(word) > 1:
            # A capitalised first word is a name only when the next word is capitalised too
            # ("Mario Addison added"), not when it merely starts the sentence ("Fellow lineman").
            starts = i == 0 or any(c in text[found[i - 1].end():found[i].start()] for c in ".!?:\n")
            if not starts or (i + 1 < len(words) and words[i + 1][:1].isupper()):
                names.add(stem(low))
    return Facts(frozenset(numbers), frozenset(dates), frozenset(names), negated)


@cache_short_texts(maxsize=16_384)
def canonical_tokens(text: str) -> tuple[str | None, ...]:
    """Each token as facts() names it (numbers normalised, months abbreviated, words stemmed and
    lower-cased); None for stop words, which never anchor a fact."""
    out: list[str | None] = []
    for word in tokens(text):
        low = word.lower()
        number = _number(word)
        if number is not None:
            out.append(number)
        elif low in _MONTHS:
            out.append(_MONTHS[low])
        elif low in STOP_WORDS:
            out.append(None)
        else:
            out.append(stem(low))
    return tuple(out)


def _neighbours(seq: tuple[str | None, ...], at: int, reach: int = 3) -> set[str]:
    """The content tokens within ``reach`` positions of ``at``."""
    return {t for t in seq[max(0, at - reach):at] + seq[at + 1:at + 1 + reach] if t is not None}


def _is_number(token: str | None) -> bool:
    return token is not None and token[:1].isdigit()


def topic_terms(text: str) -> frozenset[str]:
    """What a statement speaks of: its content words without the numbers and months it states
    ("the launch is on March 3 in Berlin" and "... April 9 in Berlin" share a topic)."""
    months = set(_MONTHS.values())
    return frozenset(t for t in canonical_tokens(text) if t is not None and not _is_number(t) and t not in months)


def slot_check(value: str, kind: FactKind, claim_text: str, evidence_text: str) -> str | None:
    """Where the claim states ``value`` (a number or month), what the evidence states in the same
    place, found by the content words around it: "agreed" (the same value), "contradicted" (another
    value of the same kind: "gave up 24 points" against "gave up 308 points"), or None when the
    evidence has no such place."""
    claim_seq, evidence_seq = canonical_tokens(claim_text), canonical_tokens(evidence_text)
    claimed = facts(claim_text).of_kind(kind)
    others = facts(evidence_text).of_kind(kind) - claimed

    def around(seq: tuple[str | None, ...], at: int) -> set[str]:
        return {t for t in _neighbours(seq, at) if not _is_number(t)}

    verdicts: list[str] = []
    for i, token in enumerate(claim_seq):
        if token != value:
            continue
        near = around(claim_seq, i)
        # The place that shares the most surrounding words is where the evidence speaks of it.
        same = max((len(near & around(evidence_seq, j)) for j, t in enumerate(evidence_seq) if t == value),
                   default=0)
        other = max((len(near & around(evidence_seq, j)) for j, t in enumerate(evidence_seq) if t in others),
                    default=0)
        verdicts.append("contradicted" if other > same else "agreed" if same else "unplaced")
    if "contradicted" in verdicts:
        return "contradicted"
    return "agreed" if "agreed" in verdicts else None


@dataclass(frozen=True)
class FactCheck:
    """How a claim's facts fare against its evidence."""

    agreed: tuple[str, ...]
    contradicted: tuple[str, ...]  # absent, while the evidence states another fact of the same kind
    unverifiable: tuple[str, ...]  # absent, and the evidence states nothing of that kind
    negation_mismatch: bool

    @property
    def checked(self) -> int:
        return len(self.agreed) + len(self.contradicted) + len(self.unverifiable) + int(self.negation_mismatch)


def compare(claim_text: str, evidence_text: str, negation_text: str | None = None) -> FactCheck:
    """Each fact of the claim as agreed (stated in the evidence, in the same place when the place
    can be found), contradicted (another value in its place, or another fact of the same kind and
    not this one) or unverifiable (the evidence states nothing of that kind). A name also agrees when the evidence
    uses the word uncapitalised or at a sentence start. Negation is compared with
    ``negation_text`` (the one aligned sentence) when given: a "not" in a neighbouring sentence
    says nothing about this claim."""
    claim, evidence = facts(claim_text), facts(evidence_text)
    evidence_words = {t for t in canonical_tokens(evidence_text) if t is not None}
    agreed: list[str] = []
    contradicted: list[str] = []
    unverifiable: list[str] = []
    for kind, value in claim.all():
        stated = value in evidence.of_kind(kind) or (kind == "name" and value in evidence_words)
        # Names span several tokens and move around in paraphrases: their presence is the check.
        placed = slot_check(value, kind, claim_text, evidence_text) if kind != "name" else None
        if placed == "agreed" or (placed is None and stated):
            agreed.append(value)
        elif placed == "contradicted" or evidence.of_kind(kind) - claim.of_kind(kind):
            contradicted.append(value)
        else:
            unverifiable.append(value)
    negated = evidence.negated if negation_text is None else facts(negation_text).negated
    return FactCheck(tuple(agreed), tuple(contradicted), tuple(unverifiable), claim.negated != negated)
