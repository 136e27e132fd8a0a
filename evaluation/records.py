"""Reading dataset files line by line with errors that say where: the 1-based line, the field and
what to fix (:class:`DatasetError`), and the content hash that versions a dataset, fed by the same
single pass over the bytes."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from rag_service.errors import InvalidInputError

VERSION_LENGTH = 16  # hex characters of the sha256 kept as the version: 64 bits, plenty for telling data apart
INTEGER = re.compile(r"[+-]?[0-9]+")


class Digest(Protocol):
    """What the loaders need of a hashlib hash."""

    def update(self, data: bytes, /) -> None: ...

    def digest(self) -> bytes: ...


class DatasetError(InvalidInputError):
    """A dataset cannot be loaded. ``file``, ``line`` (1-based) and ``field`` say where, when known."""

    def __init__(self, problem: str, *, file: str | Path | None = None, line: int | None = None,
                 field: str | None = None, item: str | None = None) -> None:
        self.problem = problem
        self.file = str(file) if file is not None else None
        self.line = line
        self.field = field
        self.item = item
        place = " ".join(part for part in (self.file, f"line {line}" if line else None, item) if part)
        if field:
            place = f"{place}, field {field!r}" if place else f"field {field!r}"
        super().__init__(f"{place}: {problem}" if place else problem)


def content_version(kind: str, parts: Iterable[tuple[str, Digest]]) -> str:
    """Each part is a sha256 of one file's (or the rows') bytes; fixed-size digests behind labels keep
    the parts from running into each other, and the kind keeps a QA file from matching a golden set."""
    outer = hashlib.sha256(kind.encode() + b"\n")
    for label, digest in parts:
        outer.update(label.encode() + b"\n" + digest.digest())
    return outer.hexdigest()[:VERSION_LENGTH]


def require_file(path: Path, what: str) -> None:
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "no such file"
        raise DatasetError(f"{problem}; expected {what} at this path", file=path)


def read_lines(path: Path, digest: Digest) -> Iterator[tuple[int, str]]:
    """The decoded lines of a file with 1-based numbers, streamed; every byte read feeds ``digest``,
    so the version costs no second pass."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            digest.update(raw)
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"not valid UTF-8 (byte {exc.start + 1} of the line); convert the file to UTF-8",
                                   file=path, line=number) from None
            yield number, text.rstrip("\r\n")


def read_json_lines(path: Path, digest: Digest) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, text in read_lines(path, digest):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"not valid JSON ({exc.msg}, column {exc.colno}); each line must be one JSON object",
                               file=path, line=number) from None
        if not isinstance(row, dict):
            raise DatasetError(f"expected a JSON object, got {json_type(row)}", file=path, line=number)
        yield number, row


def required_text(row: Mapping[str, Any], key: str, file: Path, number: int, what: str) -> str:
    value = row.get(key)
    if value is None:
        raise DatasetError(f"missing; give {what} as a string", file=file, line=number, field=key)
    if not isinstance(value, str):
        raise DatasetError(f"expected a string, got {json_type(value)}", file=file, line=number, field=key)
    if not value.strip():
        raise DatasetError(f"empty; give {what}", file=file, line=number, field=key)
    return value


def optional_text(row: Mapping[str, Any], key: str, file: Path, number: int) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DatasetError(f"expected a string, got {json_type(value)}", file=file, line=number, field=key)
    return value


def identifier(row: Mapping[str, Any], key: str, file: Path, number: int, why: str) -> str:
    """Ids are strings; integers are taken as their decimal text, as BEIR tools do."""
    value = row.get(key)
    if value is None:
        raise DatasetError(f"missing; {why}", file=file, line=number, field=key)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DatasetError(f"expected a string, got {json_type(value)}", file=file, line=number, field=key)
    text = str(value)
    if not text.strip():
        raise DatasetError("empty; ids must be non-empty strings", file=file, line=number, field=key)
    return text


def string_list(value: Any, key: str, file: Path, number: int, *, allow_empty_list: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise DatasetError(f"expected a list of strings, got {json_type(value)}", file=file, line=number, field=key)
    if not value and not allow_empty_list:
        raise DatasetError("empty; give at least one", file=file, line=number, field=key)
    for position, element in enumerate(value):
        if not isinstance(element, str):
            raise DatasetError(f"expected a string, got {json_type(element)}", file=file, line=number,
                               field=f"{key}[{position}]")
        if not element.strip():
            raise DatasetError("empty string; remove it or fill it in", file=file, line=number,
                               field=f"{key}[{position}]")
    return tuple(value)


def check_unique(key: str, number: int, first_line: dict[str, int], file: Path, field_name: str, what: str) -> None:
    if key in first_line:
        raise DatasetError(f"{key!r} is also the {field_name} of the {what} on line {first_line[key]}; ids must be "
                           f"unique", file=file, line=number, field=field_name)
    first_line[key] = number


def is_int(text: str) -> bool:
    # Stricter than int(), which also takes "1_0" and non-ASCII digits.
    return INTEGER.fullmatch(text.strip()) is not None


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
