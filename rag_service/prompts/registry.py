"""A small prompt registry: named Jinja2 templates with versions, shipped in the package.

``templates/<name>.v<version>.j2``; the highest version is current. The review issue extends
this with versions stored in the database, experiments and promotion.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from jinja2 import Environment, StrictUndefined, TemplateSyntaxError

from rag_service.errors import ConfigError, NotFoundError

_SECTION = re.compile(r"^\[(system|user|assistant)\]\s*$", re.M)
_FILE = re.compile(r"^(?P<name>[a-z0-9_]+)\.v(?P<version>\d+)\.j2$")
_ENV = Environment(undefined=StrictUndefined, autoescape=False, trim_blocks=True, lstrip_blocks=True,
                   keep_trailing_newline=False)


@dataclass(frozen=True)
class Prompt:
    name: str
    version: int
    source: str

    def sections(self) -> list[tuple[str, str]]:
        """(role, template source) per ``[system]`` / ``[user]`` / ``[assistant]`` section."""
        parts = _SECTION.split(self.source)
        sections = list(zip(parts[1::2], parts[2::2], strict=True))
        if not sections:
            raise ConfigError(f"prompt {self.name} v{self.version} has no [system]/[user] sections")
        return sections

    def render(self, **variables: Any) -> list[dict[str, str]]:
        """Chat messages, one per section. Sections are split before rendering, so text inside the
        variables (a question, a retrieved passage) can never start a message of its own."""
        return [{"role": role, "content": _ENV.from_string(source).render(**variables).strip()}
                for role, source in self.sections()]


class PromptRegistry:
    def __init__(self) -> None:
        self._prompts: dict[str, dict[int, Prompt]] = {}
        for entry in resources.files("rag_service.prompts").joinpath("templates").iterdir():
            m = _FILE.match(entry.name)
            if not m:
                continue
            source = entry.read_text(encoding="utf-8")
            prompt = Prompt(m["name"], int(m["version"]), source)
            try:
                for _, section in prompt.sections():
                    _ENV.parse(section)
            except TemplateSyntaxError as exc:
                raise ConfigError(f"prompt template {entry.name} is invalid: {exc}") from exc
            self._prompts.setdefault(m["name"], {})[prompt.version] = prompt

    def get(self, name: str, version: int | None = None) -> Prompt:
        versions = self._prompts.get(name)
        if not versions:
            raise NotFoundError(f"no prompt named {name!r}; known: {sorted(self._prompts)}")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise NotFoundError(f"prompt {name!r} has versions {sorted(versions)}, not {version}")
        return versions[version]

    def names(self) -> list[str]:
        return sorted(self._prompts)
