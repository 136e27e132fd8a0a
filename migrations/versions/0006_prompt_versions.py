"""The learning loop: prompt and guideline versions with movable labels and an audit of every
label move, experiments between two labels, the answers' experiment and variant, and the
reviewer console's sessions.

The shipped prompt templates become version 1 of their prompt (label ``production``), and the
router's guidelines move from ``guideline_sets`` ("newest wins") into the same versions, the newest
labelled ``production``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GUIDELINES = "router"  # the name the router's guidelines are versioned under (kind 'guidelines')


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "prompt_versions",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),  # prompt | guidelines
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        # A Jinja2 template with [system]/[user] sections, or the guidelines as JSON.
        sa.Column("body", sa.Text, nullable=False),
        # model tier and temperature; the extractive generator's own (max_sentences, ...)
        sa.Column("parameters", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("author", sa.Text),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("note", sa.Text),
        sa.Column("parent_version", sa.Integer),
        # The reviews a candidate was built from.
        sa.Column("review_ids", pg.ARRAY(pg.UUID(as_uuid=True)), nullable=False,
                  server_default=sa.text("'{}'::uuid[]")),
        _created_at(),
        sa.UniqueConstraint("kind", "name", "version", name="uq_prompt_versions_kind_name_version"),
        sa.CheckConstraint("kind IN ('prompt', 'guidelines')", name="ck_prompt_versions_kind"),
        sa.CheckConstraint("source IN ('default', 'review', 'manual', 'optimizer')", name="ck_prompt_versions_source"),
        sa.CheckConstraint("version >= 1", name="ck_prompt_versions_version"),
    )
    # Versions are immutable: the database refuses an UPDATE, whoever sends it.
    op.execute("CREATE FUNCTION prompt_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "RAISE EXCEPTION 'prompt versions are immutable: create a new version instead' "
               "USING ERRCODE = 'integrity_constraint_violation'; END $$")
    op.execute("CREATE TRIGGER prompt_versions_no_update BEFORE UPDATE ON prompt_versions "
               "FOR EACH ROW EXECUTE FUNCTION prompt_versions_immutable()")
    op.create_table(
        "prompt_labels",
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("moved_by", sa.Text),
        sa.Column("moved_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "name", "label"),
        sa.ForeignKeyConstraint(["kind", "name", "version"],
                                ["prompt_versions.kind", "prompt_versions.name", "prompt_versions.version"],
                                name="fk_prompt_labels_version"),
    )
    op.create_table(
        "prompt_label_moves",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("from_version", sa.Integer),  # null: the label is new
        sa.Column("to_version", sa.Integer, nullable=False),
        sa.Column("actor", sa.Text),
        sa.Column("reason", sa.Text),
        # promote --force: moved although the evidence did not say the candidate wins
        sa.Column("forced", sa.Boolean, nullable=False, server_default=sa.false()),
        # a rollback undoes the last move not yet undone; two rollbacks walk back two moves
        sa.Column("rollback", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("experiment_id", pg.UUID(as_uuid=True)),
        _created_at(),
    )
    op.create_index("ix_prompt_label_moves_label", "prompt_label_moves", ["kind", "name", "label", "id"])

    op.create_table(
        "experiments",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),  # the prompt's name
        sa.Column("control_label", sa.Text, nullable=False),
        sa.Column("candidate_label", sa.Text, nullable=False),
        # The versions the labels pointed at when it started: moving a label later does not
        # change what the experiment compares.
        sa.Column("control_version", sa.Integer, nullable=False),
        sa.Column("candidate_version", sa.Integer, nullable=False),
        sa.Column("share", sa.Float, nullable=False),  # the candidate's share of traffic
        sa.Column("alpha", sa.Float, nullable=False),
        sa.Column("tau", sa.Float, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="running"),
        sa.Column("stop_reason", sa.Text),
        sa.Column("started_by", sa.Text),
        sa.Column("note", sa.Text),
        _created_at(),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('running', 'stopped', 'promoted', 'ended')", name="ck_experiments_status"),
        sa.CheckConstraint("share > 0 AND share < 1", name="ck_experiments_share"),
    )
    # One running experiment per prompt: a query must know which one assigns it.
    op.create_index("uq_experiments_running", "experiments", ["name"], unique=True,
                    postgresql_where=sa.text("status = 'running'"))

    op.add_column("answers", sa.Column("experiment_id", pg.UUID(as_uuid=True)))
    op.add_column("answers", sa.Column("variant", sa.Text))  # control | candidate
    # What the assignment was sticky to (conversation:..., key:..., query:...): the test treats one
    # unit's answers as one cluster.
    op.add_column("answers", sa.Column("experiment_unit", sa.Text))
    # {"prompt": n, "completion": m}: the generation's LLM tokens as the server reported them
    op.add_column("answers", sa.Column("llm_tokens", pg.JSONB))
    op.create_index("ix_answers_experiment", "answers", ["experiment_id", "created_at"])

    op.create_table(
        "console_sessions",
        # SHA-256 of the session cookie's random token: a copy of the table opens no session.
        sa.Column("token_hash", sa.Text, primary_key=True),
        sa.Column("key_id", pg.UUID(as_uuid=True), sa.ForeignKey("api_keys.id", ondelete="CASCADE")),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("csrf_token", sa.Text, nullable=False),
        _created_at(),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )

    _seed_prompts()
    _move_guidelines()


def _seed_prompts() -> None:
    from rag_service.prompts.registry import PromptRegistry

    registry = PromptRegistry()
    for name in registry.names():
        for prompt in registry.all_versions(name):
            _insert_version("prompt", name, prompt.version, prompt.source, registry.parameters(name),
                            "shipped template")
        _label("prompt", name, max(p.version for p in registry.all_versions(name)))


def _move_guidelines() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.text(
        "SELECT version, document, comment, created_by FROM guideline_sets ORDER BY version")).all()
    if not rows:
        from rag_service.pipeline.router import default_guidelines

        document = default_guidelines().model_dump(mode="json", exclude_none=True)
        rows = [(1, document, "shipped defaults", "system")]
    for version, document, comment, author in rows:
        _insert_version("guidelines", GUIDELINES, version, json.dumps(document, indent=2), {}, comment,
                        author=author, source="default" if author == "system" else "manual")
    _label("guidelines", GUIDELINES, rows[-1][0])
    op.drop_table("guideline_sets")


def _insert_version(kind: str, name: str, version: int, body: str, parameters: dict, note: str | None, *,
                    author: str | None = "system", source: str = "default") -> None:
    op.get_bind().execute(sa.text(
        "INSERT INTO prompt_versions (kind, name, version, body, parameters, author, source, note) "
        "VALUES (:kind, :name, :version, :body, CAST(:parameters AS jsonb), :author, :source, :note)"),
        {"kind": kind, "name": name, "version": version, "body": body, "parameters": json.dumps(parameters),
         "author": author, "source": source, "note": note})


def _label(kind: str, name: str, version: int) -> None:
    bind = op.get_bind()
    bind.execute(sa.text("INSERT INTO prompt_labels (kind, name, label, version, moved_by) "
                         "VALUES (:kind, :name, 'production', :version, 'migration')"),
                 {"kind": kind, "name": name, "version": version})
    bind.execute(sa.text("INSERT INTO prompt_label_moves (kind, name, label, from_version, to_version, actor, reason) "
                         "VALUES (:kind, :name, 'production', NULL, :version, 'migration', 'shipped version')"),
                 {"kind": kind, "name": name, "version": version})


def downgrade() -> None:
    op.create_table(
        "guideline_sets",
        sa.Column("version", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("document", pg.JSONB, nullable=False),
        sa.Column("comment", sa.Text),
        sa.Column("created_by", sa.Text),
        _created_at(),
    )
    # The production guidelines come back as the current version ("newest wins" again).
    op.execute("INSERT INTO guideline_sets (document, comment, created_by) SELECT CAST(v.body AS jsonb), v.note, "
               "v.author FROM prompt_versions v JOIN prompt_labels l ON l.kind = v.kind AND l.name = v.name "
               "AND l.version = v.version WHERE v.kind = 'guidelines' AND l.label = 'production'")
    op.drop_table("console_sessions")
    op.drop_index("ix_answers_experiment", table_name="answers")
    op.drop_column("answers", "llm_tokens")
    op.drop_column("answers", "experiment_unit")
    op.drop_column("answers", "variant")
    op.drop_column("answers", "experiment_id")
    op.drop_index("uq_experiments_running", table_name="experiments")
    op.drop_table("experiments")
    op.drop_table("prompt_label_moves")
    op.drop_table("prompt_labels")
    op.drop_table("prompt_versions")
    op.execute("DROP FUNCTION prompt_versions_immutable()")
