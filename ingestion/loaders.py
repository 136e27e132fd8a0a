"""Loaders: turn a file (or a BEIR corpus line) into text plus what a citation needs.

Every loader returns :class:`LoadedDocument` objects or raises :class:`LoadError` with a reason a
person can act on. Structure that matters for chunking is kept as Markdown headings (HTML h1-h6,
DOCX heading styles), so one heading-aware splitter serves every format.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Format = Literal["auto", "beir"]
DEFAULT_EXCLUDE = (".*", "*/.*", "__pycache__", "*.pyc", "node_modules")
# Hostile or broken files are refused before they cost much memory or time:
MAX_PDF_PAGES = 5000  # a PDF's text is extracted page by page; beyond this it is refused
MAX_UNZIPPED_BYTES = 256 * 1024 * 1024  # a DOCX (a zip) whose parts would unpack to more (a zip bomb)
MAX_CONTROL_SHARE = 0.05  # text with more control characters than this is binary under a text name


class LoadError(Exception):
    """This input cannot be ingested; the message says why."""


@dataclass
class LoadedDocument:
    source_uri: str
    text: str
    title: str | None = None
    kind: str = "text"  # text | markdown | html | pdf | docx | beir
    metadata: dict[str, Any] = field(default_factory=dict)
    modified_at: datetime | None = None
    tags: tuple[str, ...] = ()
    lob: str | None = None
    # (start_char, page_number) for paged formats, ascending by start_char.
    pages: list[tuple[int, int]] | None = None

    @property
    def markdown(self) -> bool:
        return self.kind in ("markdown", "html", "docx")


def decode_utf8(data: bytes, name: str) -> str:
    if not data.strip():
        raise LoadError("the file is empty")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LoadError(f"{name} is not valid UTF-8 (byte {exc.start}); convert it to UTF-8 first") from None
    sample = text[:65_536]
    control = sum(1 for c in sample if c < " " and c not in "\n\r\t\f")
    if control > max(32, MAX_CONTROL_SHARE * len(sample)):  # a few stray ones (a NUL in JSON text) are dropped
        raise LoadError(f"{name} looks binary ({control:,} control characters in its first {len(sample):,}); "
                        "only text files can be ingested under a text name")
    return text.replace("\x00", "")


def _text(data: bytes, name: str) -> list[LoadedDocument]:
    return [LoadedDocument(source_uri=name, text=decode_utf8(data, name), kind="text")]


def _markdown(data: bytes, name: str) -> list[LoadedDocument]:
    import frontmatter

    raw = decode_utf8(data, name)
    try:
        post = frontmatter.loads(raw)
    except Exception as exc:  # YAML errors come in many classes
        raise LoadError(f"the front matter is not valid YAML: {exc}") from None
    meta = dict(post.metadata)
    tags = meta.pop("tags", ()) or ()
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    elif not isinstance(tags, list | tuple):
        tags = [tags]
    title = meta.pop("title", None)
    lob = meta.pop("lob", None)
    text = post.content
    if not text.strip():
        raise LoadError("the document has no text after its front matter")
    if title is None:
        for line in text.splitlines():
            if line.startswith("# "):
                title = line[2:].strip()
                break
    return [LoadedDocument(
        source_uri=name, text=text, title=str(title) if title else None, kind="markdown",
        metadata=_jsonable(meta), tags=tuple(str(t) for t in tags), lob=str(lob) if lob else None,
    )]


def _html(data: bytes, name: str) -> list[LoadedDocument]:
    from bs4 import BeautifulSoup

    if not data.strip():
        raise LoadError("the file is empty")
    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "svg"]):
        tag.decompose()
    title = soup.title.get_text(strip=True) if soup.title else None
    body = soup.body or soup
    lines: list[str] = []
    for element in body.find_all(["h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "pre", "td", "th", "blockquote",
                                  "dt", "dd", "figcaption"]):
        if element.find_parent(["p", "li", "td", "th", "blockquote", "dd"]) is not None:
            continue  # nested inside a block we already take whole
        text = " ".join(element.get_text(" ", strip=True).split())
        if not text:
            continue
        if element.name[0] == "h" and element.name[1:].isdigit():
            lines.append("#" * int(element.name[1]) + " " + text)
        else:
            lines.append(text)
    if not lines:  # pages without block markup: fall back to all visible text
        lines = [" ".join(body.get_text(" ", strip=True).split())]
    text = "\n\n".join(line for line in lines if line)
    if not text.strip():
        raise LoadError("the page has no visible text")
    if title is None:
        heading = body.find("h1")
        title = heading.get_text(strip=True) if heading else None
    return [LoadedDocument(source_uri=name, text=text, title=title, kind="html")]


def _pdf(data: bytes, name: str) -> list[LoadedDocument]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if len(reader.pages) > MAX_PDF_PAGES:
            raise LoadError(f"the PDF has {len(reader.pages):,} pages; at most {MAX_PDF_PAGES:,} are ingested: "
                            "split it into parts")
        page_texts = [(page.extract_text() or "") for page in reader.pages]
        info = reader.metadata
        title = info.title if info and info.title else None
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise LoadError(f"the PDF cannot be read (corrupt or encrypted?): {exc}") from None
    parts, pages, offset = [], [], 0
    for number, page_text in enumerate(page_texts, start=1):
        page_text = page_text.replace("\x00", "").strip()
        if not page_text:
            continue
        pages.append((offset, number))
        parts.append(page_text)
        offset += len(page_text) + 2
    if not parts:
        raise LoadError("the PDF has no extractable text (scanned images need OCR first)")
    return [LoadedDocument(source_uri=name, text="\n\n".join(parts), title=title, kind="pdf", pages=pages,
                           metadata={"page_count": len(page_texts)})]


def _docx(data: bytes, name: str) -> list[LoadedDocument]:
    import zipfile

    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        # The sizes the zip declares: reading a part beyond its declared size fails its CRC check, so
        # this bounds what python-docx could unpack.
        unpacked = sum(info.file_size for info in zipfile.ZipFile(io.BytesIO(data)).infolist())
        if unpacked > MAX_UNZIPPED_BYTES:
            raise LoadError(f"the DOCX would unpack to {unpacked:,} bytes (more than {MAX_UNZIPPED_BYTES:,}); "
                            "refused as a likely zip bomb")
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        raise LoadError(f"the DOCX cannot be read: {exc}") from None
    lines = []
    for paragraph in document.paragraphs:
        text = paragraph.text.strip()
        if not text:
            continue
        style = (paragraph.style.name if paragraph.style is not None else "") or ""
        if style.startswith("Heading ") and style[8:].isdigit():
            lines.append("#" * min(int(style[8:]), 6) + " " + text)
        elif style == "Title":
            lines.append("# " + text)
        else:
            lines.append(text)
    if not lines:
        raise LoadError("the DOCX has no text")
    title = document.core_properties.title or None
    return [LoadedDocument(source_uri=name, text="\n\n".join(lines), title=title, kind="docx")]


def iter_beir(lines: Iterable[str], name: str) -> Iterator[LoadedDocument | LoadError]:
    """One document per line: {"_id", "title", "text", "metadata"}; the source URI is the _id."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            doc_id, text, title = str(row["_id"]), row.get("text") or "", row.get("title") or None
            if not isinstance(text, str) or not (title is None or isinstance(title, str)):
                raise TypeError("text and title must be strings")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            yield LoadError(f"{name} line {number}: not a BEIR corpus row ({exc})")
            continue
        if not text.strip() and not title:
            yield LoadError(f"{name} line {number} (_id {doc_id}): no title and no text")
            continue
        metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        # The title is part of what is indexed, as BEIR evaluations index "title text".
        body = f"{title}\n\n{text}" if title and text else (title or text)
        yield LoadedDocument(source_uri=doc_id, text=body, title=title, kind="beir", metadata=_jsonable(metadata))


LOADERS: dict[str, Callable[[bytes, str], list[LoadedDocument]]] = {
    ".txt": _text, ".text": _text, ".md": _markdown, ".markdown": _markdown, ".html": _html, ".htm": _html,
    ".pdf": _pdf, ".docx": _docx,
}


def load_bytes(data: bytes, name: str, *, max_bytes: int | None = None) -> list[LoadedDocument]:
    """Load one file's content by its name's extension (uploads and files alike)."""
    suffix = Path(name).suffix.lower()
    if max_bytes is not None and len(data) > max_bytes:
        raise LoadError(f"the file is {len(data):,} bytes; the limit is {max_bytes:,} (RAGSVC_INGEST_MAX_FILE_BYTES)")
    loader = LOADERS.get(suffix)
    if loader is None:
        supported = ", ".join(sorted(LOADERS))
        raise LoadError(
            f"unsupported file type {suffix or '(none)'!r}; supported: {supported}, .jsonl with --format beir"
        )
    try:
        return loader(data, name)
    except LoadError:
        raise
    except Exception as exc:  # parsers of untrusted files fail in many ways; one file must not stop a run
        raise LoadError(f"{name} could not be parsed as {suffix}: {type(exc).__name__}: {exc}") from None


def holds_many_documents(path: Path, fmt: Format) -> bool:
    """A corpus file (BEIR .jsonl): its documents have URIs of their own, not the file's."""
    return fmt == "beir" or path.suffix == ".jsonl"


def load_file(source: Source, fmt: Format, *, max_bytes: int) -> Iterator[LoadedDocument | LoadError]:
    """Every document in one file, with its source URI set: a corpus file's rows (a bad row is a
    LoadError in the stream, the others go on), or the one document of any other file. A file
    that cannot be read at all raises LoadError (or OSError)."""
    path = source.path
    if holds_many_documents(path, fmt):
        if fmt != "beir":
            raise LoadError("a .jsonl file needs --format beir (one BEIR corpus row per line)")
        with path.open(encoding="utf-8") as lines:
            yield from iter_beir(lines, path.name)
        return
    size = path.stat().st_size
    if size > max_bytes:
        raise LoadError(f"the file is {size:,} bytes; the limit is {max_bytes:,} (RAGSVC_INGEST_MAX_FILE_BYTES)")
    modified = file_modified(path)
    for doc in load_bytes(path.read_bytes(), path.name, max_bytes=max_bytes):
        doc.source_uri = source.uri
        doc.modified_at = modified
        doc.metadata.setdefault("source_path", str(path))
        yield doc


@dataclass(frozen=True)
class Source:
    """One input file: where it is and the source URI its documents get."""

    path: Path
    uri: str


def walk(paths: Iterable[Path], include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> list[Source]:
    """Files under the given paths (recursively), filtered by glob patterns on the relative path."""
    excluded = DEFAULT_EXCLUDE + tuple(exclude)
    found: dict[str, Source] = {}
    for root in paths:
        root = root.expanduser()
        if not root.exists():
            raise LoadError(f"{root} does not exist")
        if root.is_file():
            found[str(root.resolve())] = Source(root, root.resolve().as_uri())
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            dirnames[:] = sorted(d for d in dirnames if not _matches((rel_dir / d).as_posix(), d, excluded))
            for filename in sorted(filenames):
                rel = (rel_dir / filename).as_posix()
                if _matches(rel, filename, excluded):
                    continue
                if include and not _matches(rel, filename, tuple(include)):
                    continue
                path = Path(dirpath) / filename
                found[str(path.resolve())] = Source(path, path.resolve().as_uri())
    return sorted(found.values(), key=lambda s: s.uri)


def _matches(rel: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def file_modified(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)


def _jsonable(value: Any) -> Any:
    """Front matter and BEIR metadata may hold dates and other YAML types; keep JSON-safe values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
