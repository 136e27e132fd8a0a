"""How a text is asked (pure): as a question, stated as a sentence, or neither (keywords). The span
reader reads questions and keywords, not statements, and only questions get short answers."""

from __future__ import annotations

import pytest

from rag_service.text.questions import is_question, is_statement


@pytest.mark.parametrize("text, asked", [
    ("Who led the team in sacks?", True),
    ("how many sacks did the panthers have", True),  # typed into a search box
    ("in what year was the stadium built", True),
    ("the castle was named after whom", True),
    ("is the stadium in charlotte", True),
    ("Name a player who led the team in sacks.", True),
    ("A20 can act as a tumor suppressor.", False),  # a claim
    ("Statins reduce mortality in patients who have heart failure.", False),  # "who" as a relative pronoun
    ("Patients whose tumours express HER2 respond to trastuzumab.", False),
    ("Genes which control growth", False),
    ("error E-4012", False),
    ("kneading time bread", False),
])
def test_what_is_asked_as_a_question(text: str, asked: bool) -> None:
    assert is_question(text) is asked


@pytest.mark.parametrize("text, stated", [
    ("A20 can act as a tumor suppressor.", True),
    ("Kawann Short led the Panthers in sacks!", True),
    ('The committee called it "a treaty."', True),  # the full stop inside closing quotes
    ("Statins reduce mortality (in patients with heart failure.)", True),
    ("Who led the team in sacks?", False),
    ("Name a player who led the team in sacks.", False),  # asked, full stop or not
    ("warsaw population", False),  # keywords
    ("Genes which control growth", False),
    ("error E-4012", False),
])
def test_what_is_stated_as_a_sentence(text: str, stated: bool) -> None:
    assert is_statement(text) is stated
