"""The shipped prompts: named Jinja2 templates with versions, in the package, and their default
parameters.

``templates/<name>.v<version>.j2``. These are what migration 0006 stores as version 1 of each
prompt; at run time the generator and the judge read the version labelled ``production`` in the
database (``db/repos/prompts.py``), and this registry is their fallback when no database is wired
(unit tests, the library used alone): the highest shipped version.
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
# What each shipped prompt's version 1 is stored with. LLM prompts: sampling temperature (the
# model tier comes from the route unless a version sets "tier"). The extractive generator's own:
# how many sentences an answer may take and how close to the best one they must score.
SHIPPED_PARAMETERS: dict[str, dict[str, Any]] = {
    "answer_cot": {"temperature": 0.0},
    "judge_cot": {"temperature": 0.0},
    "answer_extractive": {"max_sentences": 3, "support_ratio": 0.6},
}
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

    def all_versions(self, name: str) -> list[Prompt]:
        self.get(name)  # NotFoundError naming the known prompts
        return [self._prompts[name][v] for v in sorted(self._prompts[name])]

    @staticmethod
    def parameters(name: str) -> dict[str, Any]:
        return dict(SHIPPED_PARAMETERS.get(name, {}))


def validate_template(source: str) -> None:
    """Raise ValueError saying what to fix when ``source`` is not a usable prompt template:
    sections ``[system]``/``[user]`` and valid Jinja2 in each."""
    prompt = Prompt("candidate", 0, source)
    try:
        sections = prompt.sections()
    except ConfigError as exc:
        raise ValueError("a prompt template needs at least one section line such as [system] or [user]") from exc
    for role, section in sections:
        try:
            _ENV.parse(section)
        except TemplateSyntaxError as exc:
            raise ValueError(f"the [{role}] section is not valid Jinja2 (line {exc.lineno}): {exc.message}") from exc
