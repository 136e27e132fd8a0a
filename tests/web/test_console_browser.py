"""The whole review-to-promotion flow of the reviewer console in a real browser: Debian's Chromium
driven by Playwright against a uvicorn server on a real database."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.apps import served
from tests.browser import ARTIFACTS_ROOT, launch, needs_chromium, new_page
from tests.conftest import DatabaseFactory
from tests.dbrun import run_on
from tests.web.conftest import PASSAGE, PROMPT, QUESTION, QUOTE, console_settings, create_key, seed_review_item
from tests.web.test_console import CORRECTED_PROMPT

ARTIFACTS = ARTIFACTS_ROOT / "console"


def simulate_traffic(url: str, experiment_id: uuid.UUID, control: int, candidate: int, per_variant: int = 150) -> None:
    """Answers given under the experiment, as the pipeline logs them (query, answer with variant
    and latency, local grades; none queued for review): the candidate scores ~0.85, the control ~0.70."""
    rng = np.random.default_rng(20261123)
    start = datetime.now(UTC)
    queries, answers, scores = [], [], []
    for i in range(2 * per_variant):
        variant, version, mean = ("candidate", candidate, 0.85) if i % 2 else ("control", control, 0.70)
        overall = float(np.clip(rng.normal(mean, 0.08), 0, 1))
        query_id, at = uuid.uuid4(), start + timedelta(seconds=i)
        queries.append((query_id, f"simulated question {i}", at))
        answers.append((uuid.uuid4(), query_id, f"simulated answer {i}", PROMPT, version, experiment_id, variant,
                        Jsonb({"total": float(rng.gamma(4, 30))}), at))
        metrics = {name: {"value": round(float(np.clip(overall + rng.normal(0, 0.03), 0, 1)), 4),
                          "reason": "simulated", "scorer": "local-v1"} for name in ("faithfulness", "relevance")}
        scores.append((query_id, Jsonb(metrics), overall))
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO queries (id, collection, question, outcome, created_at) "
                        "VALUES (%s, 'kb', %s, 'answered', %s)", queries)
        cur.executemany("INSERT INTO answers (id, query_id, text, generator, prompt_name, prompt_version, "
                        "experiment_id, variant, timings_ms, created_at) "
                        "VALUES (%s, %s, %s, 'extractive', %s, %s, %s, %s, %s, %s)", answers)
        cur.executemany("INSERT INTO answer_scores (query_id, scorer, metrics, overall, needs_review) "
                        "VALUES (%s, 'local-v1', %s, %s, false)", scores)


@pytest.mark.slow
@needs_chromium
def test_review_to_promotion_in_a_browser(databases: DatabaseFactory, console_data_dir: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    url = databases.create()
    reviewer, admin = create_key(url, "reviewer", "browser-reviewer"), create_key(url, "admin", "browser-admin")
    run_on(url, seed_review_item)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []

    with served(console_settings(url, console_data_dir)) as base, sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = new_page(browser)
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text} ({m.location})")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            h1 = page.get_by_role("heading", level=1)
            main = page.locator("main")

            def sign_in_as(key: str) -> None:
                page.goto(f"{base}/review")  # no session yet: redirected to sign in
                expect(h1).to_have_text("Sign in to the review console")
                page.get_by_label("API key").fill(key)
                page.get_by_role("button", name="Sign in").click()
                expect(h1).to_have_text("Review queue")

            # 1. The reviewer signs in and sees the queue.
            sign_in_as(reviewer)
            expect(page.get_by_role("link", name=QUESTION)).to_be_visible()
            page.screenshot(path=ARTIFACTS / "queue.png", full_page=True)

            # 2. The top item: a citation leads to the marked span; claim it, then decide with corrections.
            page.get_by_role("link", name=QUESTION).first.click()
            expect(h1).to_have_text("Review item")
            page.get_by_role("link", name="citation 1").click()
            assert page.url.endswith("#chunk-1")
            expect(page.locator("#chunk-1 mark")).to_have_text(QUOTE)
            expect(page.locator("#chunk-1")).to_contain_text(PASSAGE.split(".")[0])
            page.get_by_role("button", name="Claim").click()
            expect(main).to_contain_text("You claimed this item")
            page.screenshot(path=ARTIFACTS / "item.png", full_page=True)
            page.get_by_label("edited", exact=True).check()
            page.get_by_label("Category").select_option("answer_quality")
            page.get_by_label("Feedback for the team").fill("Quote the passage and keep it short.")
            page.get_by_label("Corrected answer").fill("Open Settings and choose Reset password [1].")
            page.get_by_label("Corrected prompt").fill(CORRECTED_PROMPT)
            page.get_by_role("button", name="Record decision").click()
            expect(main).to_contain_text("Decision recorded: edited (answer_quality)")
            expect(main).to_contain_text(f"candidate version 2 of {PROMPT}")

            # 3. The admin sees the candidate version, made from the review.
            page.get_by_role("button", name="Sign out").click()
            expect(h1).to_have_text("Sign in to the review console")
            sign_in_as(admin)
            page.get_by_role("link", name="Prompts", exact=True).click()
            page.get_by_role("link", name=PROMPT, exact=True).click()
            version_2 = page.locator("#version-2")
            expect(version_2).to_contain_text("candidate")
            expect(version_2).to_contain_text("review")

            # 4. An experiment: production against candidate, half the traffic each.
            page.get_by_role("link", name="Experiments", exact=True).click()
            page.get_by_label("Prompt", exact=True).select_option(PROMPT)
            page.get_by_label("Control label").fill("production")
            page.get_by_label("Candidate label").fill("candidate")
            page.get_by_label("share of traffic").fill("0.5")
            page.get_by_role("button", name="Start experiment").click()
            expect(main).to_contain_text("Experiment started.")
            experiment_id = uuid.UUID(page.url.split("/experiments/")[1].split("?")[0])
            expect(page.locator("#decision")).to_contain_text("Undecided")

            # 5. Traffic arrives; the report says the candidate wins; promote it.
            simulate_traffic(url, experiment_id, control=1, candidate=2)
            page.goto(f"{base}/review/experiments/{experiment_id}")
            expect(page.locator("#decision")).to_contain_text("The candidate wins.")
            chart = page.locator("svg[role=img]")
            expect(chart).to_have_count(1)
            expect(chart.locator("title").first).to_have_text(re.compile("Overall-score distribution"))
            expect(chart.locator("rect")).to_have_count(2 * 10 + 2)
            page.screenshot(path=ARTIFACTS / "experiment.png", full_page=True)
            page.get_by_role("button", name="Promote").click()
            expect(main).to_contain_text("The candidate was promoted")
            expect(page.locator("#production")).to_contain_text("version 2")

            page.get_by_role("link", name="versions and label audit").click()
            expect(page.locator("#version-2")).to_contain_text("production")
            audit = page.locator("tr", has_text="browser-admin").filter(has_text="production")
            expect(audit).to_have_count(1)
            expect(audit).to_contain_text(f"experiment {experiment_id}")
        finally:
            browser.close()

    assert not problems, "\n".join(problems)
    for name in ("queue.png", "item.png", "experiment.png"):
        assert (ARTIFACTS / name).stat().st_size > 0, name
