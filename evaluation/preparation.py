"""From a loaded dataset to what a run executes: the items (question, relevant documents, reference
answers and passages), the corpus to ingest, and the collection it lives in. Pure functions.

A question/answer file with reference passages (SQuAD, XQuAD) has no corpus of its own: its distinct
passages become the corpus, each with an id derived from its text, and a question's passages are its
relevant documents; so retrieval metrics work on QA data too.
"""

from __future__ import annotations

import hashlib
import json
import re

from evaluation.datasets import CorpusDocument, Dataset, QAItem, RetrievalItem
from evaluation.items import EvalItem
from ingestion.loaders import LoadedDocument
from rag_service.domain import EvalRunRequest

_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_.-]+")


def passage_id(text: str) -> str:
    return "ctx-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def eval_items(dataset: Dataset, limit: int | None = None) -> list[EvalItem]:
    chosen = dataset.items[:limit] if limit else dataset.items
    items: list[EvalItem] = []
    for item in chosen:
        if isinstance(item, RetrievalItem):
            items.append(EvalItem(id=item.id, question=item.query, relevant=dict(item.relevant)))
        else:
            assert isinstance(item, QAItem)
            relevant = {passage_id(c): 1 for c in item.contexts} if dataset.kind == "qa" else {}
            items.append(EvalItem(id=item.id, question=item.question, relevant=relevant, references=item.answers,
                                  reference_contexts=item.contexts, collection=item.collection))
    return items


def corpus_documents(dataset: Dataset) -> list[CorpusDocument]:
    """The documents the run's collection must hold: the BEIR corpus, or a QA file's passages."""
    if dataset.corpus is not None:
        return list(dataset.corpus)
    if dataset.kind != "qa":
        return []  # golden items are asked in the collections they came from
    seen: dict[str, CorpusDocument] = {}
    for item in dataset.items:
        assert isinstance(item, QAItem)
        for text in item.contexts:
            seen.setdefault(passage_id(text), CorpusDocument(id=passage_id(text), title=None, text=text))
    return list(seen.values())


def as_loaded(document: CorpusDocument) -> LoadedDocument:
    """A corpus row as ingestion takes it; the title is indexed with the text, as BEIR evaluations do
    (the same as ``ragsvc ingest --format beir``)."""
    body = f"{document.title}\n\n{document.text}" if document.title and document.text else (
        document.title or document.text)
    return LoadedDocument(source_uri=document.id, text=body, title=document.title, kind="beir",
                          metadata=dict(document.metadata))


def corpus_version(documents: list[CorpusDocument]) -> str:
    """A content hash of the corpus alone (ids, titles, texts, metadata), in its order."""
    digest = hashlib.sha256()
    for document in documents:
        digest.update(json.dumps([document.id, document.title, document.text, document.metadata],
                                 sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def default_collection(dataset: Dataset) -> str:
    """A collection of the dataset's own, named by the hash of its corpus: a changed corpus gets a new
    one; the same corpus reuses it, whatever the split, queries or qrels (they change no document)."""
    name = _NOT_IN_NAMES.sub("-", dataset.name).strip("-")[:60] or "dataset"
    return f"eval-{dataset.kind}-{name}-{corpus_version(corpus_documents(dataset))[:12]}"


def run_collection(dataset: Dataset, request: EvalRunRequest) -> str:
    if dataset.kind == "golden":
        return request.collection or "(each golden item's own)"
    return request.collection or default_collection(dataset)
