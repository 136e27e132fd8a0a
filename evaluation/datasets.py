"""Evaluation datasets: BEIR directories, question/answer JSONL files and the reviewers' golden items.

Loading is pure (files or rows in, frozen values out) and streams line by line. Each dataset carries a
version, a content hash over exactly the bytes that define it, so a run record says which data it measured
and a comparison can refuse two runs on different data. Bad input raises :class:`DatasetError`, whose
message names the file, the 1-based line and the field, and says what to fix.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evaluation.records import (
    DatasetError,
    Digest,
    check_unique,
    content_version,
    identifier,
    is_int,
    json_type,
    optional_text,
    read_json_lines,
    read_lines,
    require_file,
    required_text,
    string_list,
)

DatasetKind = Literal["beir", "qa", "golden"]
SPEC_FORMS = "beir:DIR, qa:FILE or golden"


@dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    answers: tuple[str, ...]
    contexts: tuple[str, ...] = ()  # reference passages, when the dataset has them
    collection: str | None = None  # golden items remember the collection they were asked in


@dataclass(frozen=True)
class RetrievalItem:
    id: str
    query: str
    relevant: dict[str, int]  # corpus id -> graded relevance, as the qrels give it (0 = judged not relevant)


@dataclass(frozen=True)
class CorpusDocument:
    id: str
    title: str | None
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    kind: DatasetKind
    name: str
    version: str
    split: str | None
    items: tuple[RetrievalItem, ...] | tuple[QAItem, ...]
    corpus: tuple[CorpusDocument, ...] | None
    source: str  # the directory, file or table it came from

    def __len__(self) -> int:
        return len(self.items)


# --- BEIR -----------------------------------------------------------------------------------------


def load_beir(directory: str | Path, split: str = "test") -> Dataset:
    """A BEIR directory: ``corpus.jsonl`` (``_id``, ``title``, ``text``, optional ``metadata``),
    ``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``,
    ``score``, tab-separated, header line optional). The items are the queries judged in that split,
    in the order the qrels first name them. The version hashes the corpus, the queries and this
    split's qrels; other splits do not change it."""
    root = Path(directory)
    if not split or "/" in split or "\\" in split or split.startswith("."):
        raise DatasetError(f"{split!r} is not a split name; give the stem of a file in qrels/, e.g. test",
                           field="split")
    if not root.is_dir():
        raise DatasetError("not a directory; a BEIR dataset is a folder holding corpus.jsonl, queries.jsonl "
                           "and qrels/<split>.tsv", file=root)
    corpus_path, queries_path = root / "corpus.jsonl", root / "queries.jsonl"
    qrels_path = root / "qrels" / f"{split}.tsv"
    # Every file is checked before the corpus is parsed, so a wrong path or split fails at once.
    require_file(corpus_path, "the BEIR corpus, one JSON document per line")
    require_file(queries_path, "the BEIR queries, one JSON query per line")
    if not qrels_path.is_file():
        raise DatasetError(f"no such file, so no judgements for split {split!r}; {_splits_hint(root)}",
                           file=qrels_path)

    corpus_digest, queries_digest, qrels_digest = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    corpus = _corpus(corpus_path, corpus_digest)
    queries = _queries(queries_path, queries_digest)
    known_documents = {document.id for document in corpus}
    judged = _qrels(qrels_path, qrels_digest, queries_path, queries, corpus_path, known_documents)
    if not judged:
        raise DatasetError(f"no judgements for split {split!r}: the file has no qrels lines; {_splits_hint(root)}",
                           file=qrels_path)
    items = tuple(RetrievalItem(id=qid, query=queries[qid], relevant=relevant) for qid, relevant in judged.items())
    version = content_version("beir", [("corpus", corpus_digest), ("queries", queries_digest), ("qrels", qrels_digest)])
    return Dataset(kind="beir", name=root.resolve().name, version=version, split=split, items=items,
                   corpus=corpus, source=str(root))


def _corpus(path: Path, digest: Digest) -> tuple[CorpusDocument, ...]:
    documents: list[CorpusDocument] = []
    first_line: dict[str, int] = {}
    for number, row in read_json_lines(path, digest):
        doc_id = identifier(row, "_id", path, number, "every corpus document needs an _id")
        check_unique(doc_id, number, first_line, path, "_id", "document")
        title = optional_text(row, "title", path, number)
        text = optional_text(row, "text", path, number)
        if not title.strip() and not text.strip():
            raise DatasetError("empty, and the title is empty too; a document needs a title or a text",
                               file=path, line=number, field="text")
        metadata = row.get("metadata")
        if metadata is None:
            metadata = {}
        elif not isinstance(metadata, dict):
            raise DatasetError(f"expected a JSON object (or no metadata), got {json_type(metadata)}",
                               file=path, line=number, field="metadata")
        documents.append(CorpusDocument(id=doc_id, title=title or None, text=text, metadata=metadata))
    if not documents:
        raise DatasetError("no documents; the corpus needs at least one JSON line", file=path)
    return tuple(documents)


def _queries(path: Path, digest: Digest) -> dict[str, str]:
    queries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, row in read_json_lines(path, digest):
        qid = identifier(row, "_id", path, number, "every query needs an _id")
        check_unique(qid, number, first_line, path, "_id", "query")
        queries[qid] = required_text(row, "text", path, number, "the query text")
    if not queries:
        raise DatasetError("no queries; the file needs at least one JSON line", file=path)
    return queries


def _qrels(path: Path, digest: Digest, queries_path: Path, queries: Mapping[str, object], corpus_path: Path,
           documents: set[str]) -> dict[str, dict[str, int]]:
    """Query id -> {corpus id: score}, queries in order of first appearance."""
    judged: dict[str, dict[str, int]] = {}
    pair_line: dict[tuple[str, str], int] = {}
    first = True
    for number, text in read_lines(path, digest):
        if not text.strip():
            continue
        columns = text.split("\t")
        # BEIR writes a header (query-id, corpus-id, score); a first line whose score is no integer is one.
        if first and len(columns) == 3 and not is_int(columns[2]):
            first = False
            continue
        first = False
        if len(columns) != 3:
            spaces = " (the columns are separated by tabs, not spaces)" if len(columns) == 1 and " " in text else ""
            raise DatasetError(f"expected 3 tab-separated columns (query-id, corpus-id, score), found "
                               f"{len(columns)}{spaces}", file=path, line=number)
        qid, doc_id, score = (column.strip() for column in columns)
        for name, value in (("query-id", qid), ("corpus-id", doc_id)):
            if not value:
                raise DatasetError("empty; every qrels line names a query and a document", file=path, line=number,
                                   field=name)
        if not is_int(score):
            raise DatasetError(f"{score!r} is not an integer; relevance is a whole number (0 = not relevant)",
                               file=path, line=number, field="score")
        if qid not in queries:
            raise DatasetError(f"query {qid!r} is not in {queries_path}; fix the id or add the query", file=path,
                               line=number, field="query-id")
        if doc_id not in documents:
            raise DatasetError(f"document {doc_id!r} is not in {corpus_path}; fix the id or add the document",
                               file=path, line=number, field="corpus-id")
        if (qid, doc_id) in pair_line:
            raise DatasetError(f"query {qid!r} already judges document {doc_id!r} on line {pair_line[qid, doc_id]}; "
                               f"keep one judgement per pair", file=path, line=number, field="corpus-id")
        pair_line[qid, doc_id] = number
        judged.setdefault(qid, {})[doc_id] = int(score)
    return judged


def _splits_hint(root: Path) -> str:
    folder = root / "qrels"
    splits = sorted(path.stem for path in folder.glob("*.tsv")) if folder.is_dir() else []
    if not splits:
        return f"there are no qrels files in {folder}"
    return f"splits in {folder}: {', '.join(splits)}"


# --- question/answer JSONL ------------------------------------------------------------------------


def load_qa(path: str | Path) -> Dataset:
    """Question/answer JSONL, one object per line: ``question``; ``answers`` (a list of strings or
    SQuAD's ``{"text": [...]}``) or ``reference`` (a string); optional ``contexts`` (a list of
    strings) or ``context`` (one string, as SQuAD and XQuAD have it); optional ``id`` (else the
    line number). Other fields are ignored. The version hashes the file's bytes."""
    file = Path(path)
    require_file(file, "a question/answer JSONL file")
    digest = hashlib.sha256()
    items: list[QAItem] = []
    first_line: dict[str, int] = {}
    for number, row in read_json_lines(file, digest):
        item = _qa_item(row, file, number)
        check_unique(item.id, number, first_line, file, "id", "question")
        items.append(item)
    if not items:
        raise DatasetError("no questions; the file needs at least one JSON line with a question", file=file)
    return Dataset(kind="qa", name=file.stem, version=content_version("qa", [("file", digest)]), split=None,
                   items=tuple(items), corpus=None, source=str(file))


def _qa_item(row: Mapping[str, Any], file: Path, number: int) -> QAItem:
    question = required_text(row, "question", file, number, "the question to ask")
    has_answers, has_reference = row.get("answers") is not None, row.get("reference") is not None
    if has_answers and has_reference:
        raise DatasetError("given together with answers; give answers or reference, not both", file=file,
                           line=number, field="reference")
    if has_reference:
        answers: tuple[str, ...] = (required_text(row, "reference", file, number, "the reference answer"),)
    elif has_answers:
        answers = _answers(row["answers"], file, number)
    else:
        raise DatasetError("missing; give answers (a list of strings) or reference (a string)", file=file,
                           line=number, field="answers")
    if row.get("contexts") is not None and row.get("context") is not None:
        raise DatasetError("given together with contexts; give contexts (a list) or context (a string), not both",
                           file=file, line=number, field="context")
    if row.get("context") is not None:
        contexts: tuple[str, ...] = (required_text(row, "context", file, number, "the reference passage"),)
    else:
        contexts = string_list(row.get("contexts", []), "contexts", file, number, allow_empty_list=True)
    item_id = identifier(row, "id", file, number, "") if row.get("id") is not None else str(number)
    return QAItem(id=item_id, question=question, answers=answers, contexts=contexts)


def _answers(value: Any, file: Path, number: int) -> tuple[str, ...]:
    if isinstance(value, dict):  # SQuAD: {"text": [...], "answer_start": [...]}
        if "text" not in value:
            raise DatasetError('missing; SQuAD-style answers are {"text": ["..."]}', file=file, line=number,
                               field="answers.text")
        return string_list(value["text"], "answers.text", file, number)
    if isinstance(value, str):
        raise DatasetError("expected a list of strings, got a string; write [\"...\"] or use reference for a single "
                           "answer", file=file, line=number, field="answers")
    return string_list(value, "answers", file, number)


# --- golden items ---------------------------------------------------------------------------------


def golden_dataset(rows: Iterable[Mapping[str, Any]]) -> Dataset:
    """The reviewers' golden items (rows of ``golden_items``: id, collection, question, answer,
    citations, source) as QA items sorted by id: the approved answer is the one reference answer,
    the citations' quotes are the reference contexts. The version hashes the canonical JSON of
    those fields, sorted by id, so neither row order nor created_at changes it."""
    records: dict[str, dict[str, Any]] = {}
    for index, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise DatasetError(f"expected a mapping of column to value, got {type(row).__name__}",
                               item=f"golden item #{index}")
        if row.get("id") is None or not str(row["id"]).strip():
            raise DatasetError("missing; every golden item has an id", item=f"golden item #{index}", field="id")
        item_id = str(row["id"])  # a uuid.UUID from the database
        where = f"golden item {item_id}"
        if item_id in records:
            raise DatasetError("appears twice; pass each golden item once", item=where, field="id")
        record: dict[str, Any] = {"id": item_id}
        for name in ("collection", "question", "answer", "source"):
            value = row.get(name)
            if not isinstance(value, str) or not value.strip():
                problem = "missing" if value is None else (
                    "empty" if isinstance(value, str) else f"expected a string, got {json_type(value)}")
                raise DatasetError(problem, item=where, field=name)
            record[name] = value
        citations = row.get("citations") if row.get("citations") is not None else []
        if not isinstance(citations, list | tuple) or not all(isinstance(c, Mapping) for c in citations):
            raise DatasetError("expected a list of citation objects", item=where, field="citations")
        record["citations"] = [dict(citation) for citation in citations]
        for position, citation in enumerate(record["citations"]):
            if citation.get("quote") is not None and not isinstance(citation["quote"], str):
                raise DatasetError(f"expected a string, got {json_type(citation['quote'])}", item=where,
                                   field=f"citations[{position}].quote")
        records[item_id] = record
    if not records:
        raise DatasetError("no golden items; approved or edited review decisions become golden items "
                           "(`ragsvc review decide`)", item="golden items")
    ordered = [records[key] for key in sorted(records)]
    try:
        canonical = json.dumps(ordered, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               default=_uuid_to_str).encode()
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"a citation holds a value JSON cannot represent ({exc})", item="golden items",
                           field="citations") from None
    items = tuple(QAItem(id=record["id"], question=record["question"], answers=(record["answer"],),
                         contexts=tuple(c["quote"] for c in record["citations"] if c.get("quote")),
                         collection=record["collection"]) for record in ordered)
    version = content_version("golden", [("items", hashlib.sha256(canonical))])
    return Dataset(kind="golden", name="golden", version=version, split=None, items=items, corpus=None,
                   source="golden_items")


def _uuid_to_str(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


# --- the CLI's --dataset --------------------------------------------------------------------------


def parse_dataset_spec(spec: str) -> tuple[DatasetKind, Path | None]:
    """``beir:DIR`` -> ("beir", DIR), ``qa:FILE`` -> ("qa", FILE), ``golden`` -> ("golden", None).
    Only the syntax is checked; the loaders say when the path is wrong."""
    kind, colon, rest = spec.strip().partition(":")
    kind, rest = kind.strip().lower(), rest.strip()
    if not kind:
        raise DatasetError(f"empty; give {SPEC_FORMS}", field="--dataset")
    if kind == "golden":
        if rest:
            raise DatasetError(f"golden takes no path (golden items come from the database); give just golden, "
                               f"not {spec!r}", field="--dataset")
        return "golden", None
    if kind in ("beir", "qa"):
        if not rest:
            what = "a BEIR directory, beir:DIR" if kind == "beir" else "a JSONL file, qa:FILE"
            raise DatasetError(f"{spec!r} names no path; give {what}", field="--dataset")
        return ("beir" if kind == "beir" else "qa"), Path(rest).expanduser()
    hint = ""
    if not colon:
        hint = f" (did you mean qa:{spec.strip()}?)" if spec.strip().endswith((".jsonl", ".json")) else (
            f" (did you mean beir:{spec.strip()}?)" if "/" in spec else "")
    raise DatasetError(f"unknown dataset {spec!r}; give {SPEC_FORMS}{hint}", field="--dataset")
