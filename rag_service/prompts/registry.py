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

from jinja2 import StrictUndefined, TemplateSyntaxError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

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
# The variables each prompt is rendered with, and those its template must use: a new version may
# use no others (StrictUndefined would fail every answer at render time) and must keep these.
TEMPLATE_VARIABLES: dict[str, frozenset[str]] = {
    "answer_cot": frozenset({"passages", "question", "sub_questions", "injection_flagged"}),
    "judge_cot": frozenset({"question", "sub_questions", "contexts", "answer", "reference"}),
    "answer_extractive": frozenset({"question"}),
    "prompt_optimizer": frozenset({"template", "feedback"}),
}
REQUIRED_VARIABLES: dict[str, frozenset[str]] = {
    "answer_cot": frozenset({"passages", "question"}),
    "judge_cot": frozenset({"question", "contexts", "answer"}),
    "prompt_optimizer": frozenset({"template", "feedback"}),
}
# Versions are written by admins, reviewers' corrections and an LLM optimizer: render them in
# Jinja2's sandbox, so a template can format data but never reach Python objects or the process.
_ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False, trim_blocks=True,
                                     lstrip_blocks=True, keep_trailing_newline=False)


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
                validate_template(source, m["name"])
            except ValueError as exc:
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


def validate_template(source: str, name: str | None = None) -> None:
    """Raise ValueError saying what to fix when ``source`` is not a usable template for prompt
    ``name``: sections ``[system]``/``[user]``, valid Jinja2 in each, only the variables that
    prompt is rendered with, and those it needs."""
    prompt = Prompt(name or "candidate", 0, source)
    try:
        sections = prompt.sections()
    except ConfigError as exc:
        raise ValueError("a prompt template needs at least one section line such as [system] or [user]") from exc
    used: set[str] = set()
    for role, section in sections:
        try:
            used |= meta.find_undeclared_variables(_ENV.parse(section))
        except TemplateSyntaxError as exc:
            raise ValueError(f"the [{role}] section is not valid Jinja2 (line {exc.lineno}): {exc.message}") from exc
    if name in TEMPLATE_VARIABLES:
        unknown = used - TEMPLATE_VARIABLES[name]
        if unknown:
            raise ValueError(f"the template uses variables {sorted(unknown)} that {name} is not rendered with; "
                             f"available: {sorted(TEMPLATE_VARIABLES[name])}")
        missing = REQUIRED_VARIABLES.get(name, frozenset()) - used
        if missing:
            raise ValueError(f"the template must use {sorted(missing)} ({name} would not see its input otherwise)")
