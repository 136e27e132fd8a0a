"""What the intent parser reads out of a question (the router and the generator act on it)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

QueryType = Literal["factual", "exact_lookup", "comparison", "multi_step", "summary", "temporal", "out_of_scope"]
Complexity = Literal["simple", "moderate", "complex"]


class TimeRangeModel(BaseModel):
    expression: str
    start: datetime | None
    end: datetime | None


class Entities(BaseModel):
    identifiers: list[str] = Field(default_factory=list)
    quoted: list[str] = Field(default_factory=list)
    numbers: list[str] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)

    def main(self) -> str | None:
        """The most specific thing the question is about (for resolving a follow-up's "it")."""
        for group in (self.identifiers, self.quoted, self.names):
            if group:
                return group[0]
        return None


class Turn(BaseModel):
    """What a later question in the conversation may refer back to."""

    question: str
    subject: str | None


class Intent(BaseModel):
    question: str = Field(description="The question as the pipeline reads it (references resolved).")
    original: str
    query_type: QueryType
    entities: Entities
    time_ranges: list[TimeRangeModel]
    sub_questions: list[str]
    complexity: Complexity
    ambiguity: float = Field(ge=0, le=1)
    missing: list[str] = Field(description="What the question lacks to be answerable.")
    clarifications: list[str] = Field(description="Questions to ask back instead of guessing.")
    resolved_references: dict[str, str] = Field(default_factory=dict)
    confidence: float = Field(ge=0, le=1, description="How sure the rules are of the query type.")
    parsed_by: Literal["rules", "rules+llm"] = "rules"
    # What a follow-up's "it" refers to; kept with the conversation's turns, not in the output.
    subject: str | None = Field(default=None, exclude=True)
