"""Prompt-injection phrasing, as patterns: flagged in questions (the guardrails) and in ingested
chunks (their metadata, ``injection_flags``), so neither is taken as an instruction unnoticed."""

from __future__ import annotations

import re

INJECTION_PATTERNS = [
    ("ignore-instructions", re.compile(
        r"\b(ignore|disregard|forget|override)\b[^.?!\n]{0,40}\b(previous|prior|above|earlier|all|your|the)\b"
        r"[^.?!\n]{0,20}\b(instructions?|prompts?|rules|directions|context)\b", re.I)),
    # "act as" only as an order: sentence-initial or after "please", "now", "you will/must..." ("A20
    # can act as a tumour suppressor" is a quote from a paper, not an instruction).
    ("role-override", re.compile(
        r"\b(you are now|pretend (to be|you are)|from now on you)\b"
        r"|(^|[.!?:;\n])\s*act as\b"
        r"|\b(please|now|from now on|you (will|must|should|shall)|i want you to),?\s+act as\b", re.I)),
    ("system-prompt", re.compile(
        r"\b(system prompt|developer message|hidden instructions?|reveal (your|the) (prompt|instructions))\b", re.I)),
    ("chat-markup", re.compile(r"<\|?(im_start|im_end|system|assistant)\|?>|\[/?INST\]|###\s*(system|instruction)",
                               re.I)),
    ("jailbreak", re.compile(r"\b(jailbreak|DAN mode|do anything now|developer mode)\b", re.I)),
]


def injection_flags(text: str) -> tuple[str, ...]:
    """The names of the patterns ``text`` matches, in pattern order."""
    return tuple(name for name, pattern in INJECTION_PATTERNS if pattern.search(text))
