"""Dataset loaders on small fixtures of each format, their errors, content versions, and the real data."""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from evaluation.datasets import (
    CorpusDocument,
    DatasetError,
    QAItem,
    RetrievalItem,
    golden_dataset,
    load_beir,
    load_qa,
    parse_dataset_spec,
)
from rag_service.errors import InvalidInputError

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"the shared data folder {SHARED_DATA} "
                                       "is missing")

CORPUS = [
    {"_id": "d1", "title": "Alpha", "text": "alpha text", "metadata": {"year": 2020}},
    {"_id": "d2", "title": "", "text": "beta text"},
    {"_id": "d3", "title": "Gamma", "text": ""},
]
QUERIES = [
    {"_id": "q1", "text": "what is alpha"},
    {"_id": "q2", "text": "beta?", "metadata": {}},
    {"_id": "q3", "text": "never judged"},
    {"_id": "q4", "text": "judged in train only"},
]
HEADER = "query-id\tcorpus-id\tscore\n"
TEST_QRELS = HEADER + "q2\td2\t2\nq1\td1\t1\nq2\td3\t0\n"
TRAIN_QRELS = HEADER + "q4\td1\t1\n"


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def make_beir(root: Path, files: dict[str, str] | None = None) -> Path:
    """A valid BEIR directory; ``files`` replaces some files' text (relative path -> content)."""
    contents = {"corpus.jsonl": jsonl(CORPUS), "queries.jsonl": jsonl(QUERIES), "qrels/test.tsv": TEST_QRELS,
                "qrels/train.tsv": TRAIN_QRELS, **(files or {})}
    for name, text in contents.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def assert_names(error: DatasetError, file: Path | None, line: int | None, field: str | None, *fragments: str) -> None:
    """The message (what the user sees) and the attributes (what a caller reads) both say where."""
    message = str(error)
    if file is not None:
        assert error.file == str(file) and str(file) in message
    if line is not None:
        assert error.line == line and f"line {line}" in message
    else:
        assert error.line is None and " line " not in message.split(":")[0]
    if field is not None:
        assert error.field == field and f"field '{field}'" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# --- BEIR -----------------------------------------------------------------------------------------


def test_beir_items_are_the_judged_queries_in_qrels_order(tmp_path: Path) -> None:
    dataset = load_beir(make_beir(tmp_path / "mini"), "test")
    assert dataset.kind == "beir" and dataset.name == "mini" and dataset.split == "test"
    assert dataset.source == str(tmp_path / "mini")
    assert dataset.items == (RetrievalItem("q2", "beta?", {"d2": 2, "d3": 0}), RetrievalItem("q1", "what is alpha",
                                                                                             {"d1": 1}))
    assert dataset.corpus == (CorpusDocument("d1", "Alpha", "alpha text", {"year": 2020}),
                              CorpusDocument("d2", None, "beta text", {}), CorpusDocument("d3", "Gamma", "", {}))
    assert len(dataset) == 2 and len(dataset.version) == 16 and int(dataset.version, 16) >= 0


def test_beir_split_selects_the_qrels_file(tmp_path: Path) -> None:
    root = make_beir(tmp_path)
    train, test = load_beir(root, "train"), load_beir(root, "test")
    assert [item.id for item in train.items] == ["q4"] and train.split == "train"
    assert [item.id for item in test.items] == ["q2", "q1"]
    assert train.version != test.version
    assert load_beir(root).split == "test"  # the default split


def test_beir_qrels_without_header_and_with_crlf_and_blank_lines(tmp_path: Path) -> None:
    root = make_beir(tmp_path, {"qrels/test.tsv": "q1\td1\t1\r\n\r\nq1\td2\t3\r\n"})
    [item] = load_beir(root).items
    assert item.relevant == {"d1": 1, "d2": 3}


def test_beir_integer_ids_become_strings(tmp_path: Path) -> None:
    root = make_beir(tmp_path, {"corpus.jsonl": jsonl([{"_id": 7, "text": "seven"}]),
                                "queries.jsonl": jsonl([{"_id": 1, "text": "which?"}]),
                                "qrels/test.tsv": HEADER + "1\t7\t1\n"})
    dataset = load_beir(root)
    assert dataset.items == (RetrievalItem("1", "which?", {"7": 1}),)
    assert dataset.corpus is not None and dataset.corpus[0].id == "7"


def test_beir_reads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_beir(tmp_path)
    opened: list[str] = []
    original = Path.open

    def counting_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counting_open)
    load_beir(root)
    assert sorted(opened) == ["corpus.jsonl", "queries.jsonl", "test.tsv"]


def test_beir_version_is_stable_and_independent_of_the_folder(tmp_path: Path) -> None:
    root = make_beir(tmp_path / "a")
    first, second = load_beir(root), load_beir(root)
    assert first.version == second.version
    copy = shutil.copytree(root, tmp_path / "elsewhere")
    assert load_beir(copy).version == first.version


@pytest.mark.parametrize(("name", "old", "new"), [
    ("corpus.jsonl", "alpha text", "alpha texT"),
    ("queries.jsonl", "what is alpha", "what is alphA"),
    ("qrels/test.tsv", "q1\td1\t1", "q1\td1\t2"),
])
def test_beir_version_changes_with_one_byte(tmp_path: Path, name: str, old: str, new: str) -> None:
    root = make_beir(tmp_path)
    before = load_beir(root).version
    path = root / name
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1
    path.write_text(text.replace(old, new), encoding="utf-8")
    assert load_beir(root).version != before


def test_beir_version_ignores_other_splits(tmp_path: Path) -> None:
    root = make_beir(tmp_path)
    before = load_beir(root, "test").version
    (root / "qrels" / "train.tsv").write_text(TRAIN_QRELS.replace("\t1\n", "\t2\n"), encoding="utf-8")
    assert load_beir(root, "test").version == before


BEIR_ERRORS = [
    # (file, its content, line, field, fragments of the message)
    ("corpus.jsonl", jsonl(CORPUS[:1]) + '{"_id": "d2", "text": \n', 2, None, ("not valid JSON",)),
    ("corpus.jsonl", jsonl(CORPUS[:1]) + "[1, 2]\n", 2, None, ("expected a JSON object, got an array",)),
    ("corpus.jsonl", jsonl([CORPUS[0], {"title": "t", "text": "x"}]), 2, "_id", ("missing",)),
    ("corpus.jsonl", jsonl([{"_id": "d1", "text": ["alpha"]}]), 1, "text", ("expected a string, got an array",)),
    ("corpus.jsonl", jsonl([{"_id": True, "text": "alpha"}]), 1, "_id", ("expected a string, got a boolean",)),
    ("corpus.jsonl", jsonl([*CORPUS, {"_id": "d1", "text": "again"}]), 4, "_id", ("'d1'", "line 1", "unique")),
    ("corpus.jsonl", jsonl([*CORPUS, {"_id": "d4", "title": " ", "text": ""}]), 4, "text", ("title or a text",)),
    ("corpus.jsonl", jsonl([*CORPUS, {"_id": "d4", "text": "x", "metadata": [1]}]), 4, "metadata",
     ("expected a JSON object",)),
    ("queries.jsonl", jsonl([QUERIES[0], {"_id": "q2"}]), 2, "text", ("missing",)),
    ("queries.jsonl", jsonl([QUERIES[0], {"_id": "q2", "text": "  "}]), 2, "text", ("empty",)),
    ("queries.jsonl", jsonl([QUERIES[0], {"_id": "q2", "text": 5}]), 2, "text", ("expected a string, got a number",)),
    ("qrels/test.tsv", HEADER + "q1\td1\n", 2, None, ("expected 3 tab-separated columns", "found 2")),
    ("qrels/test.tsv", HEADER + "q1 d1 1\n", 2, None, ("found 1", "tabs, not spaces")),
    ("qrels/test.tsv", HEADER + "q1\td1\t1\nq2\td2\thigh\n", 3, "score", ("'high' is not an integer",)),
    ("qrels/test.tsv", HEADER + "q1\td1\t0.5\n", 2, "score", ("'0.5' is not an integer",)),
    ("qrels/test.tsv", HEADER + "q1\td1\t1\nq1\td9\t1\n", 3, "corpus-id", ("'d9'", "corpus.jsonl")),
    ("qrels/test.tsv", HEADER + "q9\td1\t1\n", 2, "query-id", ("'q9'", "queries.jsonl")),
    ("qrels/test.tsv", HEADER + "q1\td1\t1\nq1\td1\t2\n", 3, "corpus-id", ("already judges", "line 2")),
    ("qrels/test.tsv", HEADER + "\td1\t1\n", 2, "query-id", ("empty",)),
]


@pytest.mark.parametrize(("name", "content", "line", "field", "fragments"), BEIR_ERRORS)
def test_beir_errors_name_file_line_and_field(tmp_path: Path, name: str, content: str, line: int,
                                              field: str | None, fragments: tuple[str, ...]) -> None:
    root = make_beir(tmp_path, {name: content})
    with pytest.raises(DatasetError) as caught:
        load_beir(root)
    assert_names(caught.value, root / name, line, field, *fragments)


def test_beir_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    root = make_beir(tmp_path)
    (root / "queries.jsonl").write_bytes(jsonl(QUERIES[:1]).encode() + b'{"_id": "q2", "text": "caf\xe9"}\n')
    with pytest.raises(DatasetError) as caught:
        load_beir(root)
    assert_names(caught.value, root / "queries.jsonl", 2, None, "not valid UTF-8")


def test_beir_split_with_no_judgements_names_the_splits_that_exist(tmp_path: Path) -> None:
    root = make_beir(tmp_path, {"qrels/dev.tsv": HEADER + "\n"})
    with pytest.raises(DatasetError) as caught:
        load_beir(root, "dev")
    assert_names(caught.value, root / "qrels" / "dev.tsv", None, None, "no judgements for split 'dev'",
                 "dev, test, train")


def test_beir_missing_split_names_the_expected_path_and_the_splits(tmp_path: Path) -> None:
    root = make_beir(tmp_path)
    with pytest.raises(DatasetError) as caught:
        load_beir(root, "validation")
    assert_names(caught.value, root / "qrels" / "validation.tsv", None, None, "no such file", "test, train")


def test_beir_without_qrels_folder_says_so(tmp_path: Path) -> None:
    root = make_beir(tmp_path)
    shutil.rmtree(root / "qrels")
    with pytest.raises(DatasetError, match="there are no qrels files in"):
        load_beir(root)


@pytest.mark.parametrize("name", ["corpus.jsonl", "queries.jsonl"])
def test_beir_missing_file_names_the_expected_path(tmp_path: Path, name: str) -> None:
    root = make_beir(tmp_path)
    (root / name).unlink()
    with pytest.raises(DatasetError) as caught:
        load_beir(root)
    assert_names(caught.value, root / name, None, None, "no such file")


@pytest.mark.parametrize(("name", "fragment"), [("corpus.jsonl", "no documents"), ("queries.jsonl", "no queries")])
def test_beir_empty_corpus_or_queries(tmp_path: Path, name: str, fragment: str) -> None:
    root = make_beir(tmp_path, {name: "\n"})
    with pytest.raises(DatasetError) as caught:
        load_beir(root)
    assert_names(caught.value, root / name, None, None, fragment)


def test_beir_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        load_beir(tmp_path / "nowhere")
    assert_names(caught.value, tmp_path / "nowhere", None, None, "not a directory", "corpus.jsonl")


@pytest.mark.parametrize("split", ["", "../test", "a/b"])
def test_beir_split_must_be_a_name(tmp_path: Path, split: str) -> None:
    with pytest.raises(DatasetError) as caught:
        load_beir(make_beir(tmp_path), split)
    assert_names(caught.value, None, None, "split", "not a split name")


def test_dataset_error_is_an_invalid_input_error() -> None:
    error = DatasetError("empty", file="f.jsonl", line=3, field="question")
    assert isinstance(error, InvalidInputError) and error.exit_code == 2 and error.status_code == 422
    assert str(error) == "f.jsonl line 3, field 'question': empty"


# --- question/answer JSONL ------------------------------------------------------------------------

QA_LINES = [
    json.dumps({"id": "a", "question": "Q1?", "answers": ["x", "y"], "contexts": ["c1", "c2"]}),
    json.dumps({"question": "Q2?", "reference": "ref"}),
    "",
    json.dumps({"id": 7, "question": "Q4?", "answers": {"text": ["s1", "s2"], "answer_start": [0, 3]},
                "context": "para", "title": "ignored"}),
    json.dumps({"question": "Q5?", "answers": ["z"]}),
]


def write_qa(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_qa_formats_and_id_defaults(tmp_path: Path) -> None:
    dataset = load_qa(write_qa(tmp_path / "mini.jsonl", QA_LINES))
    assert dataset.kind == "qa" and dataset.name == "mini" and dataset.split is None and dataset.corpus is None
    assert dataset.items == (
        QAItem("a", "Q1?", ("x", "y"), ("c1", "c2")),
        QAItem("2", "Q2?", ("ref",)),  # no id: the 1-based line number
        QAItem("7", "Q4?", ("s1", "s2"), ("para",)),  # SQuAD-style answers, a single context
        QAItem("5", "Q5?", ("z",)),  # the blank line 3 still counts
    )


def test_qa_version_is_stable_and_independent_of_the_path(tmp_path: Path) -> None:
    path = write_qa(tmp_path / "a.jsonl", QA_LINES)
    first = load_qa(path).version
    assert load_qa(path).version == first
    assert load_qa(shutil.copy(path, tmp_path / "b.jsonl")).version == first


@pytest.mark.parametrize(("old", "new"), [('"Q5?"', '"Q6?"'), ("\n\n", "\n \n")])
def test_qa_version_changes_with_one_byte(tmp_path: Path, old: str, new: str) -> None:
    path = write_qa(tmp_path / "a.jsonl", QA_LINES)
    before = load_qa(path)
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1
    path.write_text(text.replace(old, new), encoding="utf-8")
    after = load_qa(path)
    assert after.version != before.version


QA_ERRORS = [
    # (lines, line, field, fragments)
    (['{"question": "Q?", "answers": ["a"]}', '{"question": "Q?", answers: []}'], 2, None, ("not valid JSON",)),
    (['"just a string"'], 1, None, ("expected a JSON object, got a string",)),
    (['{"answers": ["a"]}'], 1, "question", ("missing",)),
    (['{"question": "", "answers": ["a"]}'], 1, "question", ("empty",)),
    (['{"question": ["Q?"], "answers": ["a"]}'], 1, "question", ("expected a string, got an array",)),
    (['{"question": "Q?"}'], 1, "answers", ("missing", "reference")),
    (['{"question": "Q?", "answers": "a"}'], 1, "answers", ("got a string", "reference")),
    (['{"question": "Q?", "answers": ["a", 3]}'], 1, "answers[1]", ("expected a string, got a number",)),
    (['{"question": "Q?", "answers": ["a", " "]}'], 1, "answers[1]", ("empty string",)),
    (['{"question": "Q?", "answers": []}'], 1, "answers", ("empty", "at least one")),
    (['{"question": "Q?", "answers": {"answer_start": [0]}}'], 1, "answers.text", ("missing",)),
    (['{"question": "Q?", "answers": {"text": []}}'], 1, "answers.text", ("empty",)),
    (['{"question": "Q?", "answers": ["a"], "reference": "b"}'], 1, "reference", ("not both",)),
    (['{"question": "Q?", "reference": 4}'], 1, "reference", ("expected a string, got a number",)),
    (['{"question": "Q?", "answers": ["a"], "contexts": "c"}'], 1, "contexts", ("expected a list of strings",)),
    (['{"question": "Q?", "answers": ["a"], "contexts": ["c"], "context": "c"}'], 1, "context", ("not both",)),
    (['{"question": "Q?", "answers": ["a"], "id": {"x": 1}}'], 1, "id", ("expected a string, got an object",)),
    (['{"question": "Q?", "answers": ["a"], "id": ""}'], 1, "id", ("empty",)),
    (['{"id": "q", "question": "Q?", "answers": ["a"]}', '{"id": "q", "question": "R?", "answers": ["b"]}'], 2,
     "id", ("'q'", "line 1", "unique")),
    # an explicit id can collide with a defaulted one
    (['{"question": "Q?", "answers": ["a"]}', '{"id": "1", "question": "R?", "answers": ["b"]}'], 2, "id",
     ("'1'", "line 1")),
]


@pytest.mark.parametrize(("lines", "line", "field", "fragments"), QA_ERRORS)
def test_qa_errors_name_file_line_and_field(tmp_path: Path, lines: list[str], line: int, field: str | None,
                                            fragments: tuple[str, ...]) -> None:
    path = write_qa(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DatasetError) as caught:
        load_qa(path)
    assert_names(caught.value, path, line, field, *fragments)


def test_qa_empty_file(tmp_path: Path) -> None:
    path = write_qa(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DatasetError) as caught:
        load_qa(path)
    assert_names(caught.value, path, None, None, "no questions")


@pytest.mark.parametrize("make", [lambda p: p / "missing.jsonl", lambda p: p])
def test_qa_missing_file_names_the_path(tmp_path: Path, make: Any) -> None:
    path = make(tmp_path)
    with pytest.raises(DatasetError) as caught:
        load_qa(path)
    assert_names(caught.value, path, None, None, "expected a question/answer JSONL file")


def test_qa_reads_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + QA_LINES[0].encode() + b"\n")
    assert load_qa(path).items[0].id == "a"


# --- golden items ---------------------------------------------------------------------------------

FIRST, SECOND = uuid.UUID(int=1), uuid.UUID(int=2)


def golden_rows() -> list[dict[str, Any]]:
    return [
        {"id": SECOND, "review_id": uuid.uuid4(), "collection": "docs", "question": "How do I rotate keys?",
         "answer": "Run the rotate command [1][2].", "source": "approved",
         "citations": [{"n": 1, "quote": "run rotate", "source_uri": "ops.md"}, {"n": 2, "quote": "weekly"}],
         "created_at": datetime(2025, 1, 2, tzinfo=UTC)},
        {"id": FIRST, "collection": "hr", "question": "Leave policy?", "answer": "25 days.", "citations": [],
         "source": "edited", "created_at": datetime(2025, 1, 1, tzinfo=UTC)},
    ]


def test_golden_items_become_qa_items_sorted_by_id() -> None:
    dataset = golden_dataset(golden_rows())
    assert dataset.kind == "golden" and dataset.split is None and dataset.corpus is None
    assert dataset.items == (
        QAItem(str(FIRST), "Leave policy?", ("25 days.",), (), collection="hr"),
        QAItem(str(SECOND), "How do I rotate keys?", ("Run the rotate command [1][2].",), ("run rotate", "weekly"),
               collection="docs"),
    )


def test_golden_version_ignores_order_created_at_and_id_type() -> None:
    rows = golden_rows()
    changed = [{**row, "id": str(row["id"]), "created_at": datetime(2030, 1, 1, tzinfo=UTC)} for row in rows[::-1]]
    assert golden_dataset(rows).version == golden_dataset(changed).version


@pytest.mark.parametrize(("key", "value"), [("answer", "25 days!"), ("collection", "people"), ("source", "approved"),
                                            ("citations", [{"quote": "25"}])])
def test_golden_version_changes_with_content(key: str, value: Any) -> None:
    rows = golden_rows()
    before = golden_dataset(rows).version
    rows[1][key] = value
    assert golden_dataset(rows).version != before


@pytest.mark.parametrize(("change", "field", "fragment"), [
    ({"answer": None}, "answer", "missing"),
    ({"question": " "}, "question", "empty"),
    ({"collection": 3}, "collection", "expected a string, got a number"),
    ({"citations": "none"}, "citations", "list of citation objects"),
    ({"citations": [{"quote": 5}]}, "citations[0].quote", "expected a string"),
    ({"citations": [{"quote": "q", "at": {1, 2}}]}, "citations", "JSON cannot represent"),
])
def test_golden_errors_name_the_item_and_field(change: dict[str, Any], field: str, fragment: str) -> None:
    rows = golden_rows()
    rows[1].update(change)
    with pytest.raises(DatasetError) as caught:
        golden_dataset(rows)
    assert caught.value.field == field and f"field '{field}'" in str(caught.value) and fragment in str(caught.value)
    if field != "citations":  # the canonical JSON is built over all items at once
        assert str(FIRST) in str(caught.value)


def test_golden_duplicate_and_missing_ids_and_no_rows() -> None:
    rows = golden_rows()
    with pytest.raises(DatasetError, match="appears twice"):
        golden_dataset([*rows, rows[0]])
    with pytest.raises(DatasetError, match=r"golden item #2, field 'id': missing"):
        golden_dataset([rows[0], {**rows[1], "id": None}])
    with pytest.raises(DatasetError, match="no golden items"):
        golden_dataset([])


# --- the --dataset option -------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "expected"), [
    ("beir:/data/scifact", ("beir", Path("/data/scifact"))),
    ("qa:../x y.jsonl", ("qa", Path("../x y.jsonl"))),
    ("QA: data.jsonl ", ("qa", Path("data.jsonl"))),
    ("beir:C:/data", ("beir", Path("C:/data"))),  # only the first colon separates
    ("golden", ("golden", None)),
    (" golden ", ("golden", None)),
])
def test_parse_dataset_spec(spec: str, expected: tuple[str, Path | None]) -> None:
    assert parse_dataset_spec(spec) == expected


@pytest.mark.parametrize(("spec", "fragment"), [
    ("", "empty; give beir:DIR, qa:FILE or golden"),
    ("golden:items", "golden takes no path"),
    ("beir:", "give a BEIR directory, beir:DIR"),
    ("qa", "give a JSONL file, qa:FILE"),
    ("csv:data.csv", "unknown dataset 'csv:data.csv'"),
    ("data.jsonl", "did you mean qa:data.jsonl?"),
    ("../shared/data/scifact", "did you mean beir:../shared/data/scifact?"),
])
def test_parse_dataset_spec_errors(spec: str, fragment: str) -> None:
    with pytest.raises(DatasetError) as caught:
        parse_dataset_spec(spec)
    assert caught.value.field == "--dataset" and fragment in str(caught.value)


# --- the real data --------------------------------------------------------------------------------


@needs_shared_data
def test_scifact_test_split() -> None:
    dataset = load_beir(SHARED_DATA / "scifact", "test")
    assert len(dataset.items) == 300  # docs/benchmarks.md: "the 300 test queries"
    assert dataset.corpus is not None and len(dataset.corpus) == 5183
    assert sum(len(item.relevant) for item in dataset.items) == 339  # qrels/test.tsv has 339 lines after its header
    assert {score for item in dataset.items for score in item.relevant.values()} == {1}
    assert dataset.items[0].id == "1" and dataset.items[0].relevant == {"31715818": 1}
    assert all(item.query.strip() for item in dataset.items)
    assert dataset.corpus[0].id == "4983" and dataset.corpus[0].title is not None
    assert dataset.corpus[0].title.startswith("Microstructural development of human newborn")
    train = load_beir(SHARED_DATA / "scifact", "train")
    assert len(train.items) == 809 and train.version != dataset.version
    assert not {item.id for item in train.items} & {item.id for item in dataset.items}


@needs_shared_data
def test_xquad_loads_as_is() -> None:
    dataset = load_qa(SHARED_DATA / "xquad_en" / "xquad_en_flat.jsonl")
    assert len(dataset.items) == 1190
    assert all(len(item.answers) >= 1 and all(answer.strip() for answer in item.answers) for item in dataset.items)
    assert len({item.id for item in dataset.items}) == 1190  # the file's SQuAD ids, not line numbers
    assert all(len(item.contexts) == 1 for item in dataset.items)
    assert len({item.contexts[0] for item in dataset.items}) == 240  # docs: 240 paragraphs
    first = dataset.items[0]
    assert first.id == "56beb4343aeaaa14008c925b" and first.answers == ("308",)
    assert all(answer in item.contexts[0] for item in dataset.items for answer in item.answers)
