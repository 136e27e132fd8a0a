"""Prompt-injection phrasing, as patterns: flagged in questions (the guardrails), in LLM answers
(the output check) and in ingested chunks (their metadata, ``injection_flags``), so none is taken
as an instruction unnoticed.

"act as" is read two ways. In a question it is flagged wherever it stands: a false alarm there
only reminds the LLM prompt that passages are data. In prose (documents, answers) it is flagged
only as an order, at the start of a sentence or a line (after any quote mark or list or heading
markup) or after "please", "now", "you will/must/are to", "I want you to" and the like: "A20 can
act as a tumour suppressor" is a finding, and flagging it replaced good LLM answers and marked 38 of
SciFact's 5,183 abstracts."""

from __future__ import annotations

import re

_ROLE_OVERRIDE = r"\b(you are now|pretend (to be|you are)|from now on you)\b"
_ORDER_TO_ACT_AS = (
    r"(^|[.!?:;\n])[\s\"'“‘*>#-]*act as\b"
    r"|\b(please|now|from now on|then|okay|ok|just|always|kindly|you (will|must|should|shall|are to|need to)"
    r"|i want you to|(your|the) (task|job|role) is to),?\s+act as\b"
)
_IGNORE = ("ignore-instructions", re.compile(
    r"\b(ignore|disregard|forget|override)\b[^.?!\n]{0,40}\b(previous|prior|above|earlier|all|your|the)\b"
    r"[^.?!\n]{0,20}\b(instructions?|prompts?|rules|directions|context)\b", re.I))
_SYSTEM_PROMPT = ("system-prompt", re.compile(
    r"\b(system prompt|developer message|hidden instructions?|reveal (your|the) (prompt|instructions))\b", re.I))
_CHAT_MARKUP = ("chat-markup", re.compile(
    r"<\|?(im_start|im_end|system|assistant)\|?>|\[/?INST\]|###\s*(system|instruction)", re.I))
_JAILBREAK = ("jailbreak", re.compile(r"\b(jailbreak|DAN mode|do anything now|developer mode)\b", re.I))
# In the order the flags are reported.
INJECTION_PATTERNS = [_IGNORE, ("role-override", re.compile(_ROLE_OVERRIDE + r"|\bact as\b", re.I)),
                      _SYSTEM_PROMPT, _CHAT_MARKUP, _JAILBREAK]
PROSE_PATTERNS = [_IGNORE, ("role-override", re.compile(_ROLE_OVERRIDE + "|" + _ORDER_TO_ACT_AS, re.I)),
                  _SYSTEM_PROMPT, _CHAT_MARKUP, _JAILBREAK]


def injection_flags(text: str, *, prose: bool = False) -> tuple[str, ...]:
    """The names of the patterns ``text`` matches, in pattern order; ``prose`` for documents and
    answers, where "act as" counts only as an order."""
    patterns = PROSE_PATTERNS if prose else INJECTION_PATTERNS
    return tuple(name for name, pattern in patterns if pattern.search(text))
