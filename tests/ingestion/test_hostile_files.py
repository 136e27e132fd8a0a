"""Hostile and broken files are refused or bounded, one clear error each, without a memory blow-up:
binary content under a text name, invalid UTF-8, a DOCX zip bomb, a PDF with too many pages,
deeply nested HTML, a huge single line."""

from __future__ import annotations

import io
import time
import zipfile

import psutil
import pytest
from pypdf import PdfWriter

from ingestion import loaders
from ingestion.chunking import Chunker, model_tokenizer
from ingestion.loaders import LoadError, load_bytes

MB = 1024 * 1024


def rss() -> int:
    return psutil.Process().memory_info().rss


def test_binary_content_under_a_text_name_is_refused_as_binary() -> None:
    controls = bytes(range(1, 9)) * 2000  # valid UTF-8, but control characters throughout
    with pytest.raises(LoadError, match=r"looks binary"):
        load_bytes(b"header line\n" + controls, "data.txt")
    with pytest.raises(LoadError, match=r"looks binary"):
        load_bytes(b"# Title\n\n" + "A\x00".encode("utf-16-le") * 5000, "notes.md")  # UTF-16 as .md
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
    with pytest.raises(LoadError, match=r"not valid UTF-8 \(byte 0\)"):
        load_bytes(png, "image.txt")
    # Ordinary text with tabs, form feeds and CRLF line ends is text.
    assert load_bytes(b"a\tb\r\nc\fd " * 100, "ok.txt")[0].text.startswith("a\tb")


def test_a_docx_zip_bomb_is_refused_before_it_is_unpacked() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as bomb:
        bomb.writestr("[Content_Types].xml", "<Types/>")
        with bomb.open("word/document.xml", "w") as part:
            zeros = b"0" * MB
            for _ in range(300):  # 300 MB of text, a few hundred KB packed
                part.write(zeros)
    data = buffer.getvalue()
    assert len(data) < 2 * MB
    # The loader imports python-docx (and lxml) on first use: import it first, so that the clock
    # times the refusal only (on a loaded VM that import alone once took over a second in CI).
    import docx  # noqa: F401
    before = rss()
    started = time.perf_counter()
    with pytest.raises(LoadError, match=r"would unpack to 314,572,8\d\d bytes.*zip bomb"):
        load_bytes(data, "bomb.docx")
    assert time.perf_counter() - started < 1.0
    assert rss() - before < 50 * MB


def test_a_pdf_over_the_page_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loaders, "MAX_PDF_PAGES", 3)  # the bound itself is 5,000; four pages show it works
    writer = PdfWriter()
    for _ in range(4):
        writer.add_blank_page(width=200, height=200)
    pdf = io.BytesIO()
    writer.write(pdf)
    with pytest.raises(LoadError, match=r"the PDF has 4 pages; at most 3 are ingested: split it"):
        load_bytes(pdf.getvalue(), "long.pdf")


def test_deeply_nested_html_and_a_huge_single_line_load_in_bounded_time_and_memory() -> None:
    depth = 50_000
    nested = ("<div>" * depth + "<p>The deepest paragraph.</p>" + "</div>" * depth).encode()
    started = time.perf_counter()
    assert load_bytes(nested, "deep.html")[0].text == "The deepest paragraph."
    assert time.perf_counter() - started < 10

    chunker = Chunker(model_tokenizer(), chunk_size=256, chunk_overlap=32)
    chunker.chunk(load_bytes(b"warm up the tokenizer " * 50, "warm.txt")[0])
    line = b"tides rise and fall with the moon " * 9000  # about 300 KB without a line break
    before = rss()
    started = time.perf_counter()
    chunks = chunker.chunk(load_bytes(line, "line.txt")[0])
    assert len(chunks) > 250 and all(len(c.text) < 2000 for c in chunks)  # split into chunk-sized pieces
    assert time.perf_counter() - started < 20
    assert rss() - before < 200 * MB
