"""The answers benchmark's paired comparison of two runs (benchmarks/answers.py --against)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import datasets
from benchmarks.answers import answer_text_in, compare_outcomes, load_outcomes, paired_change


def test_a_one_sided_change_is_significant_and_a_balanced_one_is_not() -> None:
    # 20 questions gained, none lost: the exact two-sided McNemar p is 2 * 0.5^20.
    change = paired_change([False] * 20 + [True] * 80, [True] * 100)
    assert change["gained"] == 20 and change["lost"] == 0
    assert change["mcnemar_p"] == pytest.approx(2 * 0.5**20)
    assert (change["before"], change["after"]) == (0.8, 1.0)
    # As many lost as gained: no evidence of a change.
    balanced = paired_change([True] * 10 + [False] * 10, [False] * 10 + [True] * 10)
    assert (balanced["gained"], balanced["lost"], balanced["mcnemar_p"]) == (10, 10, 1.0)
    # Questions that agree carry no information: only the discordant ones count.
    assert paired_change([True, False], [True, False])["mcnemar_p"] == 1.0


def test_runs_of_different_lengths_or_none_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        paired_change([True], [True, False])
    with pytest.raises(ValueError, match="no questions"):
        paired_change([], [])


def test_an_outcomes_file_is_checked_before_the_run(tmp_path: Path) -> None:
    saved = {"full": {"q1": "answered"}, "hit": {"q1": True}, "removed": {"q1": "no_answer"},
             "article": {"q1": "no_answer"}}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(saved))
    assert load_outcomes(good, ["q1", "q2"]) == saved
    with pytest.raises(ValueError, match="no question in common"):
        load_outcomes(good, ["q9"])
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in saved.items() if k != "article"}))
    with pytest.raises(ValueError, match="no 'article' outcomes"):
        load_outcomes(old, ["q1"])
    with pytest.raises(ValueError, match="not a readable"):
        load_outcomes(tmp_path / "missing.json", ["q1"])


def test_outcome_files_are_compared_on_the_questions_both_hold() -> None:
    before = {"full": {"q1": "answered", "q2": "no_answer"}, "hit": {"q1": True, "q2": False},
              "removed": {"q1": "answered", "q2": "answered"}, "article": {"q1": "no_answer", "q2": "answered"}}
    after = {"full": {"q1": "answered", "q2": "answered", "q3": "answered"}, "hit": {"q1": True, "q2": True},
             "removed": {"q1": "no_answer", "q2": "answered"}, "article": {"q1": "no_answer", "q2": "no_answer"}}
    change = compare_outcomes(before, after)
    assert change["answered"]["gained"] == 1 and change["answered"]["after"] == 1.0  # q3 is in one run only
    assert change["abstained_without_paragraph"]["gained"] == 1
    assert change["abstained_without_article"] == {"before": 0.5, "after": 1.0, "gained": 1, "lost": 0,
                                                   "mcnemar_p": 1.0}


@pytest.mark.parametrize(("without", "removed_unit"), [
    ("xquad_without_article", "title"),  # the question's whole article is missing
    ("xquad_without_gold", "_id"),       # only its own paragraph is: the article's others stay
])
def test_each_question_is_asked_of_a_collection_without_what_answers_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, without: str, removed_unit: str) -> None:
    monkeypatch.setattr(datasets, "BENCH_DATA", tmp_path)  # the corpora are written there
    full = datasets.xquad()
    rows = {row["_id"]: row for row in map(json.loads, full.corpus.read_text().splitlines())}
    folds = getattr(datasets, without)()
    assert sorted(q for fold in folds for q in fold.queries) == sorted(full.queries)  # every question, once
    for fold in folds:
        kept = {json.loads(line)["_id"] for line in fold.corpus.read_text().splitlines()}
        asked_about = {paragraph for rel in fold.qrels.values() for paragraph in rel}
        units_kept = {rows[p][removed_unit] for p in kept}
        assert kept and asked_about and not units_kept & {rows[p][removed_unit] for p in asked_about}
        if removed_unit == "_id":
            assert {rows[p]["title"] for p in asked_about} <= {rows[p]["title"] for p in kept}


def test_transfer_settings_are_summarised_by_what_is_right_in_each() -> None:
    from benchmarks.answers_transfer import keyword_style, summarise, web_style

    assert web_style("  Who won the 2022 FIFA World Cup? ") == "who won the 2022 fifa world cup"
    assert keyword_style("How many points did the Panthers' defense give up in 2015?") == \
        "points panthers defense give up 2015"
    results = ([{"outcome": "answered", "right": True, "confidence": 0.9}] * 6
               + [{"outcome": "answered", "right": False, "confidence": 0.9}] * 2
               + [{"outcome": "no_answer", "right": False, "confidence": 0.05}] * 2)
    answerable = summarise(results, answerable=True)
    assert (answerable["answered"], answerable["no_answer"], answerable["questions"]) == (0.8, 0.2, 10)
    # Among the 8 answers, 6 cite a relevant source first, all at confidence 0.9: one bin, |0.75 - 0.9|.
    assert answerable["hit_at_1_of_answers"] == 0.75 and answerable["ece"] == pytest.approx(0.15)
    # Where abstaining is right, no answer can be: no hit rate or calibration is reported.
    unanswerable = summarise(results, answerable=False)
    assert "ece" not in unanswerable and unanswerable["mean_confidence_of_answers"] == 0.9
    assert summarise([], answerable=True) == {"questions": 0}


def test_an_answer_text_counts_where_a_paragraph_holds_it_as_whole_words() -> None:
    paragraphs = ["The Panthers defense gave up just 308 points.", "Denver won the game, 24-10."]
    assert answer_text_in(["308"], paragraphs)
    assert answer_text_in(["The Broncos", "Denver"], paragraphs)  # any reference answer
    assert answer_text_in(["the panthers' defense"], ["The Panthers defense held."])  # SQuAD's normalisation
    # Punctuation parts words rather than gluing them: "Manning's" holds "Manning", "24-yard" holds "24".
    assert answer_text_in(["Manning"], ["Peyton Manning’s last pass."])
    assert answer_text_in(["24"], ["A 24-yard field goal."])
    assert not answer_text_in(["30"], paragraphs)  # part of "308", not a word of its own
    assert not answer_text_in(["Carolina"], paragraphs)
    assert not answer_text_in(["", "the"], paragraphs)  # nothing left after normalising
    assert not answer_text_in(["308"], [])
