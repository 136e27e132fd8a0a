"""Evaluation reports: the self-contained HTML page (inline PNG plots that decode and are drawn, no
external references, user text escaped), Markdown with its PNGs beside it, which plots appear when,
the metric intervals, and the page as Chromium renders it (Debian's /usr/bin/chromium via Playwright)."""

from __future__ import annotations

import base64
import io
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from matplotlib.image import imread
from scipy.stats import bootstrap

from evaluation.compare import Comparison, compare
from evaluation.reports import ERRORS_SHOWN, ordered_metrics, render_html, summarise, write_report
from evaluation.summary import run_scores
from rag_service.domain.eval_runs import (
    LOWER_IS_BETTER,
    DatasetRef,
    EvalItemResult,
    EvalRun,
    EvalRunRequest,
    RetrievedRef,
)
from tests.browser import ARTIFACTS_ROOT, launch, needs_chromium, new_page

ARTIFACTS = ARTIFACTS_ROOT / "eval-report"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)" width="(\d+)" height="(\d+)"')
MARKDOWN_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
HOSTILE_QUESTION = "<script>alert('question')</script> how do I reset it?"
HOSTILE_ERROR = "TimeoutError: <img src=x onerror=alert(1)> took too long"
# A name is user data too: HTML in it must be escaped, and "$" must not start matplotlib's mathtext (an
# unknown command there fails the whole figure).
CANDIDATE = r"candidate <b>v2</b> $\bad$"
ESCAPED_CANDIDATE = r"candidate &lt;b&gt;v2&lt;/b&gt; $\bad$"
ITEMS = 40
ERROR_ITEM = 7


def make_run(name: str, *, seed: int, shift: float = 0.0, latency: bool = True, failing: int = 1,
             metrics_present: tuple[str, ...] = ("ndcg@10", "recall@10", "squad_f1", "overall", "faithfulness"),
             ranks: bool = True) -> tuple[EvalRun, list[EvalItemResult]]:
    """A finished full-mode run over ITEMS items: each item's difficulty is shared by every run (fixed
    seed), each run adds its own noise (``seed``) and ``shift`` on "overall"; faithfulness is missing on
    every fifth item, ragas_bleu is never scored, and the first ``failing`` items from ERROR_ITEM failed."""
    difficulty = np.random.default_rng(99).uniform(0.3, 0.9, ITEMS)
    rng = np.random.default_rng(seed)
    results = []
    for i in range(ITEMS):
        failed = ERROR_ITEM <= i < ERROR_ITEM + failing
        question = HOSTILE_QUESTION if i == ERROR_ITEM else f"What does setting {i} do?"
        values = {m: float(np.clip(difficulty[i] + rng.normal(0, 0.08) + (shift if m == "overall" else 0), 0, 1))
                  for m in metrics_present}
        if "faithfulness" in values and i % 5 == 0:
            values["faithfulness"] = None
        results.append(EvalItemResult(
            item_id=f"q{i:03d}", repetition=0, question=question, references=[f"answer {i}"],
            retrieved=[RetrievedRef(rank=1, id=f"doc{i}", score=0.5)],
            relevant_rank=(None if i % 6 == 0 else int(rng.integers(1, 30))) if ranks else None,
            answer=f"Answer {i}", metrics={} if failed else {**values, "ragas_bleu": None, "zz_custom": 0.5},
            latency_ms={"retrieve": 10.0, "total": float(rng.lognormal(5.5, 1.2))} if latency else {},
            cost_usd=None if failed else 0.001 * (1 + rng.random()),
            error=HOSTILE_ERROR if failed else None))
    created = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    run = EvalRun(
        id=uuid.UUID(int=seed), name=name, status="finished",
        dataset=DatasetRef(kind="beir", name="scifact", version="0123456789abcdef", split="test",
                           source="/data/scifact", items=ITEMS),
        mode="full", collection="eval-scifact", request=EvalRunRequest(dataset="beir:/data/scifact", mode="full"),
        config={"retrieval": {"top_k": 10, "hybrid": True}, "generator": "extractive",
                "note": "</details><script>alert('config')</script>"},
        config_hash="cafe0123", code_version="abc1234", seed=seed, items_total=ITEMS, items_done=ITEMS - failing,
        items_failed=failing, created_at=created, started_at=created + timedelta(seconds=5),
        finished_at=created + timedelta(minutes=3))
    return run, results


def compared(baseline: list[EvalItemResult], candidate: list[EvalItemResult]) -> Comparison:
    return compare(run_scores(baseline), run_scores(candidate), lower_is_better=LOWER_IS_BETTER, resamples=2_000,
                   seed=3)


Pair = tuple[EvalRun, list[EvalItemResult], EvalRun, list[EvalItemResult], Comparison]


@pytest.fixture(scope="module")
def pair() -> Pair:
    """The candidate (B, reported) with a planted +0.15 on "overall", its baseline (A) and the comparison."""
    baseline, baseline_results = make_run("production", seed=1)
    candidate, candidate_results = make_run(CANDIDATE, seed=2, shift=0.15)
    return candidate, candidate_results, baseline, baseline_results, compared(baseline_results, candidate_results)


# Rendering is most of this module's time (~0.3 s a plot), so the reports are made once and shared.

@pytest.fixture(scope="module")
def compared_report(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run, results, against, against_results, comparison = pair
    return write_report(tmp_path_factory.mktemp("html") / "report.html", "html", run, results, against=against,
                        against_results=against_results, comparison=comparison)


@pytest.fixture(scope="module")
def compared_html(compared_report: Path) -> str:
    return compared_report.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def alone_html(pair: Pair) -> str:
    run, results, *_ = pair
    return render_html(run, results)


@pytest.fixture(scope="module")
def sparse() -> tuple[EvalRun, list[EvalItemResult]]:
    """No latency, no relevance ranks, and 25 failed items."""
    return make_run("sparse", seed=4, latency=False, ranks=False, failing=25)


@pytest.fixture(scope="module")
def sparse_html(sparse: tuple[EvalRun, list[EvalItemResult]]) -> str:
    return render_html(*sparse)


def assert_drawn_png(data: bytes, width: int | None = None, height: int | None = None) -> None:
    """A PNG that decodes, of the stated size, with a picture on it (not one flat colour)."""
    assert data.startswith(PNG_SIGNATURE)
    pixels = imread(io.BytesIO(data), format="png")
    if width is not None:
        assert pixels.shape[:2] == (height, width)
    rgb = (pixels[..., :3].reshape(-1, 3) * 255).astype(np.int64)
    assert (rgb < 230).any(axis=1).mean() > 0.01  # more than 1% of the pixels are not near-white
    colours = np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])
    assert colours.size > 8  # axes, text and marks in several colours, not a blank canvas


def images(page: str) -> list[tuple[bytes, str, int, int]]:
    return [(base64.b64decode(data, validate=True), alt, int(w), int(h)) for data, alt, w, h in IMAGE.findall(page)]


def plot_section(page: str, key: str) -> str:
    """From the plot's heading up to the next heading."""
    start = page.index(f'<h3 id="plot-{key}">')
    return page[start:page.find("<h", start + 4)]


# --- HTML ------------------------------------------------------------------------------------------------

def test_the_html_report_is_one_self_contained_file_with_every_plot_drawn(compared_report: Path) -> None:
    page = compared_report.read_text(encoding="utf-8")
    assert [p.name for p in compared_report.parent.iterdir()] == ["report.html"]  # no partial file left behind
    found = images(page)
    assert len(found) == page.count("<img") == page.count("data:image/png;base64,") == 4
    for data, _alt, width, height in found:
        assert_drawn_png(data, width, height)
    for heading in ("Run", "Configuration", "Metrics", "Comparison", "Worst items", "Plots", "Metric distributions",
                    "Mean differences B - A", "Latency", "Score by retrieval rank", "Errors"):
        assert re.search(rf"<h[123][^>]*>{re.escape(heading)}</h[123]>", page), heading
    assert "<details><summary>Configuration snapshot" in page and "<style>" in page
    assert f"<th scope=\"col\">A: production</th><th scope=\"col\">B: {ESCAPED_CANDIDATE}</th>" in page
    # Nothing to fetch or run: no URLs, no scripts, stylesheets or frames, and every src is inline.
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert not re.search(r"<(script|link|iframe|object|embed)\b", page, re.IGNORECASE)
    assert re.findall(r'\bsrc="([^"]{0,22})', page) == ["data:image/png;base64,"] * 4


def test_text_from_the_runs_is_escaped(compared_html: str) -> None:
    assert "&lt;script&gt;alert(&#x27;question&#x27;)&lt;/script&gt; how do I reset it?" in compared_html
    assert "&lt;img src=x onerror=alert(1)&gt; took too long" in compared_html
    assert ESCAPED_CANDIDATE in compared_html and "<b>" not in compared_html
    assert "&lt;/details&gt;&lt;script&gt;" in compared_html  # a configuration value cannot close the <details>
    assert compared_html.count("</details>") == 1


def test_the_comparison_lists_every_metric_and_the_worst_items(pair: Pair, compared_html: str) -> None:
    _run, results, _against, against_results, comparison = pair
    comparison_section = compared_html[compared_html.index('<section id="comparison">'):
                                       compared_html.index('<section id="plots">')]
    rows = re.findall(r"<tr><td>([^<]+)</td><td>\d+</td>", comparison_section)
    assert rows[:len(comparison.metrics)] == ["ndcg@10", "recall@10", "squad_f1", "faithfulness", "overall",
                                              "latency_ms", "cost_usd", "zz_custom"]  # the domain's order
    overall = comparison.metric("overall")
    assert overall.significant and overall.direction == "better"  # the planted +0.15
    assert re.search(r"<td>overall</td><td>39</td>(<td>[^<]*</td>){6}<td>better \*</td>", comparison_section)
    worst = comparison.worst_items[0]
    question = next(r.question for r in results if r.item_id == worst.item_id)
    assert f"<tr><td>{worst.item_id}</td><td>{comparison.worst_by}</td>" in comparison_section
    assert question in comparison_section
    by_item = {r.item_id: r for r in against_results}
    assert by_item[worst.item_id].metrics[comparison.worst_by] == worst.values_a[comparison.worst_by]


def test_the_difference_plot_appears_only_with_a_comparison(compared_html: str, alone_html: str) -> None:
    (alt,) = [alt for _data, alt, _w, _h in images(plot_section(compared_html, "differences"))]
    assert alt.startswith("Mean differences B - A") and alt.endswith("significant: overall")
    assert len(images(alone_html)) == 3 and 'id="plot-differences"' not in alone_html
    assert '<section id="comparison">' not in alone_html and "Mean differences" not in alone_html
    assert "<th scope=\"col\">value</th>" in alone_html and "A: production" not in alone_html


def test_a_run_without_latency_leaves_that_plot_out_with_a_note(sparse_html: str) -> None:
    latency = plot_section(sparse_html, "latency")
    assert "No item recorded a total latency" in latency and "<img" not in latency
    assert "<img" in plot_section(sparse_html, "distributions")
    assert len(images(sparse_html)) == 1


def test_the_score_plotted_against_rank_is_overall_then_squad_f1_and_needs_ranks(sparse_html: str) -> None:
    run, results = make_run("no grades", seed=5, latency=False, metrics_present=("ndcg@10", "squad_f1"))
    (alt,) = [alt for _d, alt, _w, _h in images(plot_section(render_html(run, results), "score_by_rank"))]
    assert alt.startswith("Box plots of squad_f1 by rank") and "not retrieved" in alt
    section = plot_section(sparse_html, "score_by_rank")
    assert "no relevance labels" in section and "<img" not in section


def test_distributions_leave_out_metrics_never_scored_and_the_table_keeps_them(compared_html: str) -> None:
    (alt,) = [alt for _d, alt, _w, _h in images(compared_html) if alt.startswith("Histograms of")]
    assert alt == "Histograms of ndcg@10, recall@10, squad_f1, faithfulness, overall, cost_usd, zz_custom"
    metrics_section = compared_html[compared_html.index('<section id="metrics">'):]
    assert "<tr><td>ragas_bleu</td><td>0</td><td>\u2014</td>" in metrics_section
    assert "<tr><td>faithfulness</td><td>31</td>" in metrics_section  # 39 items ran, every fifth not scored
    names = ordered_metrics([[EvalItemResult(item_id="x", repetition=0, question="q",
                                             metrics={"zz": 1.0, "overall": 1.0, "aa": None, "ndcg@10": 0.5})]],
                            [{"latency_ms": {"x": 3.0}}])
    assert names == ["ndcg@10", "overall", "latency_ms", "aa", "zz"]  # known metrics in the domain's order first


def test_failed_items_are_listed_up_to_twenty(sparse_html: str, alone_html: str) -> None:
    errors = sparse_html[sparse_html.index('<section id="errors">'):]
    assert "25 item runs failed; the first 20 are shown." in errors
    assert errors.count("<tr><td>q") == ERRORS_SHOWN and "q026" in errors and "q027" not in errors
    assert "1 item run failed." in alone_html
    quiet_run, quiet_results = make_run("clean", seed=6, failing=0, latency=False, ranks=False,
                                        metrics_present=("ndcg@10",))
    assert "No item failed." in render_html(quiet_run, quiet_results)


def test_a_run_without_results_yet_gets_notes_instead_of_plots() -> None:
    run, _results = make_run("queued", seed=7)
    page = render_html(run.model_copy(update={"status": "queued", "items_done": 0, "items_failed": 0}), [])
    assert "<img" not in page and "<td>status</td><td>queued</td>" in page
    for key, note in (("distributions", "No metric has a value"), ("latency", "No item recorded a total latency"),
                      ("score_by_rank", "None of overall, squad_f1, ndcg@10 has a value")):
        assert note in plot_section(page, key)
    assert "No item failed." in page


def test_the_report_is_deterministic(pair: Pair, alone_html: str) -> None:
    run, results, *_ = pair
    assert render_html(run, results) == alone_html


# --- Markdown --------------------------------------------------------------------------------------------

def test_markdown_writes_its_plots_beside_it_and_links_them(pair: Pair, sparse: tuple, tmp_path: Path) -> None:
    run, results, against, against_results, comparison = pair
    path = write_report(tmp_path / "eval report.md", "md", run, results, against=against,
                        against_results=against_results, comparison=comparison)
    text = path.read_text(encoding="utf-8")
    assets = tmp_path / "eval report_files"
    links = MARKDOWN_IMAGE.findall(text)
    assert sorted(p.name for p in assets.iterdir()) == sorted(Path(target).name for _alt, target in links)
    assert len(links) == 4 and "data:image" not in text
    for _alt, target in links:
        assert target.startswith("eval%20report_files/")  # relative, and a valid link despite the space
        assert_drawn_png((tmp_path / unquote(target)).read_bytes())
    for heading in ("## Run", "## Configuration", "## Metrics", "## Comparison", "### Worst items", "## Plots",
                    "### Latency", "## Errors"):
        assert f"\n{heading}\n" in text, heading
    (snapshot,) = re.findall(r"```json\n(.*?)\n```", text, re.DOTALL)
    assert json.loads(snapshot) == run.config
    assert "&lt;script&gt;alert('question')&lt;/script&gt;" in text
    assert "<script" not in text.replace(snapshot, "") and "<img" not in text  # raw HTML only inside the code block

    # The same name for a run without latency or ranks: the note instead, and no stale PNGs beside it.
    text = write_report(path, "md", *sparse).read_text(encoding="utf-8")
    assert "_No item recorded a total latency (latency\\_ms\\['total'\\]): the latency plot is left out._" in text
    assert [p.name for p in assets.iterdir()] == ["distributions.png"]


def test_an_unknown_format_is_refused(pair: Pair, tmp_path: Path) -> None:
    run, results, *_ = pair
    with pytest.raises(ValueError, match="'md' or 'html'"):
        write_report(tmp_path / "r.pdf", "pdf", run, results)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


# --- the metric intervals --------------------------------------------------------------------------------

def test_metric_intervals_are_the_percentile_bootstrap_of_the_mean() -> None:
    values = np.random.default_rng(8).beta(2, 5, 300)
    half = {f"i{k:03d}": (float(v) if k % 2 else None) for k, v in enumerate(values)}
    (full, partial) = summarise({"full": {f"i{k:03d}": float(v) for k, v in enumerate(values)}, "half": half},
                                seed=0, resamples=4_000)
    assert (full.n, partial.n) == (300, 150)
    assert full.mean == pytest.approx(values.mean()) and partial.mean == pytest.approx(values[1::2].mean())
    reference = bootstrap((values,), np.mean, method="percentile", n_resamples=20_000,
                          random_state=np.random.default_rng(1)).confidence_interval
    # Monte Carlo error of either end at 4,000 resamples is ~2% of the width (~0.03); allow 10%.
    assert full.ci_low == pytest.approx(reference.low, abs=0.003)
    assert full.ci_high == pytest.approx(reference.high, abs=0.003)
    assert partial.ci_low < partial.mean < partial.ci_high and partial.ci_high - partial.ci_low > 1.2 * (
        full.ci_high - full.ci_low)  # half the items: an interval about sqrt(2) times as wide
    assert summarise({"full": half}, seed=0) == summarise({"full": half}, seed=0)
    (empty,) = summarise({"never": {"i0": None}}, seed=0)
    assert (empty.n, empty.mean, empty.ci_low) == (0, None, None)


# --- in a browser ----------------------------------------------------------------------------------------

@needs_chromium
def test_chromium_shows_every_plot(compared_report: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = new_page(browser)
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(compared_report.as_uri(), wait_until="load")
            loaded = page.evaluate("Array.from(document.images, i => [i.complete, i.naturalWidth, i.naturalHeight,"
                                   " i.getAttribute('width') | 0])")
            assert len(loaded) == 4
            for complete, natural_width, natural_height, width in loaded:
                assert complete and natural_width > 0 and natural_height > 0 and natural_width == width
            config_table = page.locator("#configuration table")
            assert not config_table.is_visible()  # collapsed until asked for
            page.locator("#configuration summary").click()
            sync_api.expect(config_table).to_be_visible()
            sync_api.expect(page.get_by_role("heading", level=1)).to_contain_text(CANDIDATE)
            page.screenshot(path=ARTIFACTS / "report.png", full_page=True)
        finally:
            browser.close()
    assert not problems, "\n".join(problems)
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []
    assert_drawn_png((ARTIFACTS / "report.png").read_bytes())
