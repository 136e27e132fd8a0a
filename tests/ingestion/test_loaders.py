"""Loaders on real files of each format, and the errors for bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingestion.loaders import LoadError, iter_beir, load_bytes, walk
from tests.ingestion.files import make_docx, make_pdf


def test_text() -> None:
    [doc] = load_bytes("héllo wörld\n".encode(), "a.txt")
    assert doc.text == "héllo wörld\n" and doc.kind == "text"


def test_markdown_front_matter_gives_title_tags_lob_and_metadata() -> None:
    raw = (b"---\ntitle: Runbook\ntags: [ops, db]\nlob: infra\nowner: alice\nreviewed: 2025-01-02\n---\n"
           b"# Heading\n\nBody.")
    [doc] = load_bytes(raw, "r.md")
    assert doc.title == "Runbook"
    assert doc.tags == ("ops", "db") and doc.lob == "infra"
    assert doc.metadata == {"owner": "alice", "reviewed": "2025-01-02"}
    assert doc.text.startswith("# Heading") and doc.markdown


def test_markdown_title_falls_back_to_first_heading() -> None:
    [doc] = load_bytes(b"intro\n# The Title\n\ntext", "x.md")
    assert doc.title == "The Title"


def test_html_keeps_text_and_headings_drops_script_and_style() -> None:
    html = (b"<html><head><title>Page</title><style>.a{}</style></head><body><script>alert(1)</script>"
            b"<h1>Top</h1><p>First <b>para</b>.</p><h2>Sub</h2><ul><li>item one</li></ul><noscript>x</noscript>"
            b"</body></html>")
    [doc] = load_bytes(html, "p.html")
    assert doc.title == "Page"
    assert doc.text == "# Top\n\nFirst para .\n\n## Sub\n\nitem one"
    assert "alert" not in doc.text and ".a{}" not in doc.text


def test_pdf_keeps_page_numbers() -> None:
    [doc] = load_bytes(make_pdf(["First page text.", "", "Third page text."]), "d.pdf")
    assert "First page text." in doc.text and "Third page text." in doc.text
    third = doc.text.index("Third")
    assert doc.pages == [(0, 1), (third, 3)]
    assert doc.metadata["page_count"] == 3


def test_docx_headings_become_markdown() -> None:
    data = make_docx([("Manual", "Title"), ("Setup", "Heading 1"), ("Install the thing.", None)])
    [doc] = load_bytes(data, "m.docx")
    assert doc.text == "# Manual\n\n# Setup\n\nInstall the thing."
    assert doc.markdown


@pytest.mark.parametrize("data, name, message", [
    (b"", "e.txt", "empty"),
    (b"   \n", "e.md", "empty"),
    (b"\xff\xfeabc", "u.txt", "not valid UTF-8"),
    (b"%PDF-1.4 garbage garbage", "c.pdf", "PDF"),
    (b"not a zip", "c.docx", "DOCX"),
    (b"data", "x.exe", "unsupported file type '.exe'"),
    (b"---\ntitle: [unclosed\n---\nbody", "f.md", "front matter"),
    (b"PK\x03\x04" + b"\x00" * 30, "z.docx", "DOCX"),
])
def test_bad_files_fail_with_a_reason(data: bytes, name: str, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        load_bytes(data, name)


def test_size_limit() -> None:
    with pytest.raises(LoadError, match="limit is 10"):
        load_bytes(b"x" * 11, "big.txt", max_bytes=10)


def test_beir_rows_and_bad_lines() -> None:
    lines = [
        json.dumps({"_id": "d1", "title": "T", "text": "body", "metadata": {"k": 1}}),
        "{not json",
        json.dumps({"_id": "d2", "title": "", "text": ""}),
        json.dumps({"_id": 3, "text": "numeric id"}),
    ]
    items = list(iter_beir(lines, "c.jsonl"))
    docs = [i for i in items if not isinstance(i, LoadError)]
    errors = [str(i) for i in items if isinstance(i, LoadError)]
    assert [(d.source_uri, d.title, d.metadata) for d in docs] == [("d1", "T", {"k": 1}), ("3", None, {})]
    assert len(errors) == 2 and "line 2" in errors[0] and "d2" in errors[1]


def test_walk_recurses_with_globs(tmp_path: Path) -> None:
    for rel in ["a.md", "sub/b.txt", "sub/deep/c.md", ".hidden/d.md", "sub/.e.md", "skip/f.md"]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    found = [s.path.relative_to(tmp_path).as_posix() for s in walk([tmp_path])]
    assert found == ["a.md", "skip/f.md", "sub/b.txt", "sub/deep/c.md"]
    only_md = [s.path.name for s in walk([tmp_path], include=("*.md",), exclude=("skip",))]
    assert only_md == ["a.md", "c.md"]
    assert walk([tmp_path / "a.md"])[0].uri == (tmp_path / "a.md").resolve().as_uri()
    with pytest.raises(LoadError, match="does not exist"):
        walk([tmp_path / "missing"])


def test_corrupt_docx_xml_is_a_load_error() -> None:
    import io
    import zipfile

    from tests.ingestion.files import make_docx

    good = zipfile.ZipFile(io.BytesIO(make_docx([("text", None)])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as broken:
        for item in good.infolist():
            data = good.read(item)
            broken.writestr(item, b"<w:document><unclosed" if item.filename == "word/document.xml" else data)
    with pytest.raises(LoadError, match="z.docx"):
        load_bytes(out.getvalue(), "z.docx")


def test_odd_front_matter_and_rows_do_not_crash() -> None:
    [doc] = load_bytes(b"---\ntags: 5\n---\nbody", "t.md")
    assert doc.tags == ("5",)
    items = list(iter_beir([json.dumps({"_id": 1, "text": 123}), json.dumps({"_id": 2, "title": ["x"]})], "c"))
    assert all(isinstance(i, LoadError) for i in items)


def test_nested_list_items_are_not_repeated() -> None:
    [doc] = load_bytes(b"<ul><li>outer<ul><li>inner</li></ul></li><li>two</li></ul>", "l.html")
    assert doc.text.count("inner") == 1 and "two" in doc.text
