"""What a generator returns: the answer, its claims and the citations that back them."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field


class Claim(BaseModel):
    text: str
    citations: list[int] = Field(description="Context numbers [n] the claim cites.")
    verified: bool = Field(description="Every cited chunk supports the claim.")
    support: float | None = Field(default=None, ge=0, le=1,
                                  description="Share of the claim's terms found in its best cited chunk; "
                                              "null when the claim has nothing to check.")


class Citation(BaseModel):
    n: int = Field(description="The [n] used in the answer text.")
    chunk_id: uuid.UUID
    document_id: uuid.UUID
    source_uri: str
    title: str | None
    start_char: int = Field(description="Offsets of the quoted span in the document.")
    end_char: int
    quote: str = Field(description="The quoted span; empty once the document is deleted.")
    verified: bool
    deleted: bool = Field(default=False, description=(
        "The cited document was deleted after the answer: the citation still says where it pointed, without "
        "the quote."))


class GeneratedAnswer(BaseModel):
    answer: str
    short_answer: str | None = Field(default=None, description="The answer span alone, when one was found.")
    citations: list[Citation] = Field(description="In order of first citation in the answer.")
    claims: list[Claim]
    confidence: float = Field(ge=0, le=1)
    reasoning_steps: list[str] = Field(default_factory=list)
    generator: Literal["extractive", "llm"]
    model: str | None = None
    prompt_name: str | None = None
    prompt_version: int | None = None
    fallback_reason: str | None = Field(default=None, description="Why the LLM answer was not used, if it wasn't.")
    answered: bool = Field(default=True, description="False: the evidence does not answer the question, and "
                                                     "the answer says so.")
    closest_sources: list[Citation] = Field(default_factory=list, description=(
        "When not answered: the passages nearest the question, for the user to look at (not support)."))
    answerability: dict[str, float] | None = Field(default=None, description=(
        "The answerability model's probability and the evidence features it read (extractive answers, and "
        "LLM replies that cite nothing)."))
