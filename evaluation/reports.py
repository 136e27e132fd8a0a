"""Evaluation reports (``ragsvc eval report RUN [--against RUN] [--format md|html]``): one run, or a run
against a baseline with their paired comparison, as a self-contained HTML page (plots inline as base64
PNG, inline CSS, no scripts and nothing fetched) or as Markdown with its PNGs in ``<stem>_files/``.

Sections: the run(s); the configuration snapshot; per metric the mean over items with a 95% percentile
bootstrap interval; the comparison and its worst items (with a baseline); plots (metric distributions,
mean differences with their intervals when there is a comparison, latency, score by retrieval rank);
the items that failed. Questions, answers, errors, names and configuration values are user data and
are escaped in both formats.

With a baseline, A is the baseline (``against``) and B the run reported, as in ``compare.py``: the
comparison is ``compare(run_scores(against_results), run_scores(results), ...)`` (``evaluation.comparisons``),
differences B - A. Item scores are ``evaluation.summary.run_scores``' (repetitions averaged, failed items left
out, latency and cost included), so the report's means and the comparison count the same items.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import numpy as np

from evaluation import plots
from evaluation.compare import Comparison, RunScores, bootstrap_means, percentile_interval
from evaluation.summary import run_scores
from rag_service.domain.eval_runs import LATENCY_METRIC, LOWER_IS_BETTER, EvalItemResult, EvalRun

CONFIDENCE = 0.95
# The Monte Carlo error of a 2.5% quantile from 2,000 resamples is about 1.5% of a 95% interval's width
# (sqrt(0.025 * 0.975 / 2000) / pdf(1.96) = 0.06 sd against a width of 3.92 sd), well below the digits shown.
BOOTSTRAP_RESAMPLES = 2_000
ERRORS_SHOWN = 20
TEXT_LIMIT = 300  # characters of a question or error shown in a table cell
PLOT_FILES = ("distributions", "differences", "latency", "score_by_rank")  # markdown asset names, in page order
DASH = "\u2014"
_METRICS_NOTE = (f"Mean over items (repetitions averaged, failed items left out) with the {CONFIDENCE:.0%} percentile "
                 "bootstrap interval of the mean; n: items scored.")


# --- the numbers ---------------------------------------------------------------------------------------

def ordered_metrics(result_sets: Sequence[Sequence[EvalItemResult]], scores: Sequence[RunScores]) -> list[str]:
    """Every metric name in the results (scored or not) and their scores, in ``plots.metric_order``."""
    names = {name for results in result_sets for result in results for name in result.metrics}
    return plots.metric_order(names | {name for run in scores for name in run})


@dataclass(frozen=True)
class MetricSummary:
    metric: str
    n: int  # items with a value
    mean: float | None
    ci_low: float | None
    ci_high: float | None


def summarise(scores: RunScores, *, seed: int, confidence: float = CONFIDENCE,
              resamples: int = BOOTSTRAP_RESAMPLES) -> list[MetricSummary]:
    """Per metric the mean over items and the percentile bootstrap interval of that mean (Efron &
    Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13), seeded.

    The resampling is the comparison's (``compare.bootstrap_means``): all metrics share each resample of
    the items; a metric missing on some items is averaged over the drawn items that have it, which
    conditional on how many it drew is the ordinary bootstrap of that metric. Resamples that drew none of
    a metric's items (only plausible with a handful) are left out of its interval."""
    names = list(scores)
    items = sorted({item for values in scores.values() for item, value in values.items() if value is not None})
    row = {item: k for k, item in enumerate(items)}
    values = np.zeros((len(items), len(names)))
    present = np.zeros((len(items), len(names)), dtype=bool)
    for column, name in enumerate(names):
        for item, value in scores[name].items():
            if value is not None:
                values[row[item], column], present[row[item], column] = value, True
    low, high = np.full(len(names), np.nan), np.full(len(names), np.nan)
    scored = present.any(axis=0)  # a metric never scored has no interval (and would warn "All-NaN slice")
    if items:
        means = bootstrap_means(values, present, resamples=resamples, rng=np.random.default_rng(seed))
        low[scored], high[scored] = percentile_interval(means[:, scored], confidence)
    summaries = []
    for column, name in enumerate(names):
        n = int(present[:, column].sum())
        mean = float(values[present[:, column], column].mean()) if n else None
        summaries.append(MetricSummary(name, n, mean, float(low[column]) if n else None,
                                       float(high[column]) if n else None))
    return summaries


# --- formatting ----------------------------------------------------------------------------------------

def _number(value: float | None, metric: str = "", *, signed: bool = False) -> str:
    if value is None:
        return DASH
    sign = "+" if signed else ""
    return f"{value:{sign}.1f}" if metric.endswith("_ms") else f"{value:{sign}.3f}"


def _p(value: float | None) -> str:
    return DASH if value is None else "<0.001" if value < 0.001 else f"{value:.3f}"


def _clip(text: str, limit: int = TEXT_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _label(run: EvalRun) -> str:
    return run.name or f"run {str(run.id)[:8]}"


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key in sorted(config):
        value = config[key]
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return flat


def _header(run: EvalRun) -> dict[str, str]:
    def when(moment: Any) -> str:
        return moment.isoformat(timespec="seconds") if moment is not None else DASH

    took = (f"{(run.finished_at - run.started_at).total_seconds():.0f} s"
            if run.started_at is not None and run.finished_at is not None else DASH)
    request = run.request
    return {
        "run id": str(run.id), "name": run.name or DASH,
        "status": run.status + (f" ({run.error})" if run.error else ""),
        "dataset": f"{run.dataset.kind} {run.dataset.name}", "dataset version": run.dataset.version,
        "split": run.dataset.split or DASH, "dataset items": str(run.dataset.items),
        "dataset source": run.dataset.source or DASH, "mode": run.mode, "collection": run.collection,
        "config hash": run.config_hash, "code version": run.code_version or DASH, "seed": str(run.seed),
        "repetitions": str(request.repeat), "limit": str(request.limit) if request.limit else "none",
        "prompts": json.dumps(request.prompts, sort_keys=True) if request.prompts else "production",
        "created": when(run.created_at), "started": when(run.started_at), "finished": when(run.finished_at),
        "duration": took, "items": f"{run.items_done} of {run.items_total} done, {run.items_failed} failed",
    }


# --- the report, once for both formats -----------------------------------------------------------------

@dataclass(frozen=True)
class _Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class _Content:
    title: str
    run: _Table
    config: _Table
    config_json: str
    metrics: _Table
    comparison: _Table | None
    comparison_note: str
    worst: _Table | None
    worst_note: str
    plots: list[plots.Plot]
    errors: _Table
    errors_total: int


def _metrics_table(metric_names: Sequence[str], summaries: Sequence[Mapping[str, MetricSummary]]) -> _Table:
    prefixes = ["A ", "B "] if len(summaries) == 2 else [""]
    rows = []
    for name in metric_names:
        row = [name + (" (lower is better)" if name in LOWER_IS_BETTER else "")]
        for summary in (by_name.get(name) for by_name in summaries):
            row += ([str(summary.n), _number(summary.mean, name), f"[{_number(summary.ci_low, name)}, "
                     f"{_number(summary.ci_high, name)}]"] if summary is not None and summary.n else ["0", DASH, DASH])
        rows.append(row)
    return _Table(["metric", *(f"{p}{c}" for p in prefixes for c in ("n", "mean", f"{CONFIDENCE:.0%} CI"))], rows)


def _comparison_tables(comparison: Comparison, questions: Mapping[str, str]) -> tuple[_Table, str, _Table, str]:
    """The comparison table and its note, the worst items and theirs."""
    table = _Table(["metric", "n", "mean A", "mean B", "diff B - A", f"{comparison.confidence:.0%} CI", "p", "Holm p",
                    "direction"], [
        [m.metric, str(m.n), _number(m.mean_a, m.metric), _number(m.mean_b, m.metric),
         _number(m.difference, m.metric, signed=True),
         f"[{_number(m.ci_low, m.metric, signed=True)}, {_number(m.ci_high, m.metric, signed=True)}]"
         if m.ci_low is not None else DASH, _p(m.p_value), _p(m.p_holm), m.direction + (" *" if m.significant else "")]
        for m in map(comparison.metric, plots.metric_order(m.metric for m in comparison.metrics))])
    only = [f"only in {side}: {', '.join(names)}" for side, names in
            (("A", comparison.metrics_only_in_a), ("B", comparison.metrics_only_in_b)) if names]
    note = (f"Differences are B - A over the items scored in both runs. Intervals: percentile bootstrap of the mean "
            f"paired difference; p: paired randomisation (sign-flip) test, {comparison.resamples} resamples, seed "
            f"{comparison.seed}; Holm p: adjusted across the {len(comparison.metrics)} metrics; * significant "
            f"(Holm p <= {1 - comparison.confidence:.2f}). Not compared: {'; '.join(only) or 'none'}.")
    by = comparison.worst_by or ""
    worst = _Table(["item", "metric", "A", "B", "diff B - A", "question"], [
        [w.item_id, by, _number(w.values_a.get(by), by), _number(w.values_b.get(by), by),
         _number(_difference(w.values_a.get(by), w.values_b.get(by)), by, signed=True),
         _clip(questions.get(w.item_id, DASH))] for w in comparison.worst_items])
    worst_note = (f"The items that got worse most on {by}, worst first." if comparison.worst_items else
                  f"No item got worse on {by}." if by else "The runs share no metric.")
    return table, note, worst, worst_note


def _build(run: EvalRun, results: Sequence[EvalItemResult], against: EvalRun | None,
           against_results: Sequence[EvalItemResult] | None, comparison: Comparison | None) -> _Content:
    pairs = [(run, results)] if against is None else [(against, against_results or []), (run, results)]
    labels = [_label(run)] if against is None else [f"A: {_label(against)}", f"B: {_label(run)}"]
    data = [plots.RunData(label, res, run_scores(res)) for label, (_, res) in zip(labels, pairs, strict=True)]
    columns = labels if against is not None else ["value"]
    headers = [_header(r) for r, _ in pairs]
    flats = [_flatten(r.config) for r, _ in pairs]
    config_rows = [[key, *(flat.get(key, DASH) for flat in flats)]
                   + (["changed" if len({flat.get(key) for flat in flats}) > 1 else ""] if against else [])
                   for key in sorted(set().union(*flats))]
    metric_names = ordered_metrics([res for _, res in pairs], [one.scores for one in data])
    summaries = [{s.metric: s for s in summarise(one.scores, seed=r.seed)}
                 for one, (r, _) in zip(data, pairs, strict=True)]
    comparison_table = worst = None
    comparison_note = worst_note = ""
    if comparison is not None:
        questions = {r.item_id: r.question for r in [*(against_results or []), *results]}
        comparison_table, comparison_note, worst, worst_note = _comparison_tables(comparison, questions)
    failed = [r for r in results if r.error]
    return _Content(
        title=f"Evaluation report: {_label(run)}" + (f" against {_label(against)}" if against is not None else ""),
        run=_Table(["field", *columns], [[field, *(h[field] for h in headers)] for field in headers[0]]),
        config=_Table(["setting", *columns] + (["changed"] if against is not None else []), config_rows),
        config_json=json.dumps(run.config, indent=2, sort_keys=True, default=str, ensure_ascii=False),
        metrics=_metrics_table(metric_names, summaries), comparison=comparison_table,
        comparison_note=comparison_note, worst=worst, worst_note=worst_note,
        # Latency has a plot of its own, over every item run rather than item means.
        plots=plots.report_plots(data, [m for m in metric_names if m != LATENCY_METRIC], comparison),
        errors=_Table(["item", "repetition", "question", "error"], [
            [r.item_id, str(r.repetition), _clip(r.question), _clip(r.error or "")] for r in failed[:ERRORS_SHOWN]]),
        errors_total=len(failed))


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _errors_text(content: _Content) -> str:
    if not content.errors_total:
        return "No item failed."
    more = content.errors_total - len(content.errors.rows)
    runs = "item run failed" if content.errors_total == 1 else "item runs failed"
    return f"{content.errors_total} {runs}" + (f"; the first {ERRORS_SHOWN} are shown." if more else ".")


# --- HTML ----------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1f2328;margin:0;background:#fff}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:32px}
h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td{font-variant-numeric:tabular-nums;overflow-wrap:break-word}
tr.changed td{background:#fff8c5}
figure{margin:12px 0}img{max-width:100%;height:auto}figcaption,.note{color:#57606a;font-size:13px}
details summary{cursor:pointer}
"""
# Nothing to load and nothing to run: even if a value escaped its escaping, the page would stay inert.
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _html_table(table: _Table, *, changed_column: bool = False) -> str:
    e = html.escape
    head = "".join(f'<th scope="col">{e(h)}</th>' for h in table.headers)
    body = "".join(
        ('<tr class="changed">' if changed_column and row[-1] else "<tr>")
        + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(run: EvalRun, results: Sequence[EvalItemResult], *, against: EvalRun | None = None,
                against_results: Sequence[EvalItemResult] | None = None,
                comparison: Comparison | None = None) -> str:
    """The report as one self-contained HTML page."""
    content = _build(run, results, against, against_results, comparison)
    e = html.escape
    out = ['<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(content.title)}</title><style>{_CSS}</style></head><body><main>",
           f"<h1>{e(content.title)}</h1>",
           f'<section id="run"><h2>Run</h2>{_html_table(content.run)}</section>',
           '<section id="configuration"><h2>Configuration</h2><details><summary>Configuration snapshot '
           f"({len(content.config.rows)} settings)</summary>"
           f"{_html_table(content.config, changed_column=against is not None)}</details></section>",
           f'<section id="metrics"><h2>Metrics</h2><p class="note">{e(_METRICS_NOTE)}</p>'
           f"{_html_table(content.metrics)}</section>"]
    if content.comparison is not None and content.worst is not None:
        out.append(f'<section id="comparison"><h2>Comparison</h2><p class="note">{e(content.comparison_note)}</p>'
                   f"{_html_table(content.comparison)}<h3>Worst items</h3><p class=\"note\">{e(content.worst_note)}</p>"
                   f"{_html_table(content.worst) if content.worst.rows else ''}</section>")
    out.append('<section id="plots"><h2>Plots</h2>')
    for plot in content.plots:
        out.append(f'<h3 id="plot-{plot.key}">{e(plot.title)}</h3>')
        if plot.png is None:
            out.append(f'<p class="note">{e(plot.text)}</p>')
            continue
        data = base64.b64encode(plot.png.data).decode("ascii")
        out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(plot.png.description)}" '
                   f'width="{plot.png.width}" height="{plot.png.height}">'
                   f"<figcaption>{e(plot.text)}</figcaption></figure>")
    out.append(f'</section><section id="errors"><h2>Errors</h2><p class="note">{e(_errors_text(content))}</p>'
               f"{_html_table(content.errors) if content.errors.rows else ''}</section></main></body></html>\n")
    return "".join(out)


# --- Markdown ------------------------------------------------------------------------------------------

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|#~!])")


def _md(text: str) -> str:
    """A table cell or line of user text: one line, markdown syntax and HTML neutralised."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.split()))
    return escaped.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_table(table: _Table) -> str:
    lines = ["| " + " | ".join(_md(h) for h in table.headers) + " |", "|" + "---|" * len(table.headers)]
    lines += ["| " + " | ".join(_md(cell) or " " for cell in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _fenced(text: str, language: str) -> str:
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}{language}\n{text}\n{fence}"


def render_markdown(run: EvalRun, results: Sequence[EvalItemResult], *, against: EvalRun | None = None,
                    against_results: Sequence[EvalItemResult] | None = None, comparison: Comparison | None = None,
                    assets_dir: Path) -> str:
    """The report as Markdown; its PNGs are written into ``assets_dir`` and linked as
    ``<assets_dir name>/<plot>.png``, so the directory must sit next to the Markdown file."""
    content = _build(run, results, against, against_results, comparison)
    assets_dir.mkdir(parents=True, exist_ok=True)
    out = [f"# {_md(content.title)}", "## Run", _md_table(content.run), "## Configuration",
           f"Configuration snapshot of {_md(_label(run))}:", _fenced(content.config_json, "json")]
    if against is not None:
        changed = _Table(content.config.headers[:-1], [row[:-1] for row in content.config.rows if row[-1]])
        out.append(_md_table(changed) if changed.rows else "The two runs have the same configuration.")
    out += ["## Metrics", _md(_METRICS_NOTE), _md_table(content.metrics)]
    if content.comparison is not None and content.worst is not None:
        out += ["## Comparison", _md(content.comparison_note), _md_table(content.comparison), "### Worst items",
                _md(content.worst_note)] + ([_md_table(content.worst)] if content.worst.rows else [])
    out.append("## Plots")
    written = set()
    for plot in content.plots:
        out.append(f"### {_md(plot.title)}")
        if plot.png is None:
            out.append(f"_{_md(plot.text)}_")
            continue
        (assets_dir / f"{plot.key}.png").write_bytes(plot.png.data)
        written.add(plot.key)
        out += [f"![{_md(plot.png.description)}]({quote(assets_dir.name)}/{plot.key}.png)", _md(plot.text)]
    for stale in set(PLOT_FILES) - written:  # a plot an earlier report of this name had and this one has not
        (assets_dir / f"{stale}.png").unlink(missing_ok=True)
    out += ["## Errors", _md(_errors_text(content))] + ([_md_table(content.errors)] if content.errors.rows else [])
    return "\n\n".join(out) + "\n"


def write_report(path: Path, fmt: Literal["md", "html"], run: EvalRun, results: Sequence[EvalItemResult], *,
                 against: EvalRun | None = None, against_results: Sequence[EvalItemResult] | None = None,
                 comparison: Comparison | None = None) -> Path:
    """Write the report to ``path`` (Markdown's PNGs into ``<stem>_files/`` beside it); returns ``path``.
    With ``against`` (the baseline, A), ``comparison`` compares it with ``run`` (B), as ``compare_runs(A, B)``."""
    path = Path(path)
    if fmt == "html":
        text = render_html(run, results, against=against, against_results=against_results, comparison=comparison)
    elif fmt == "md":
        text = render_markdown(run, results, against=against, against_results=against_results, comparison=comparison,
                               assets_dir=path.with_name(f"{path.stem}_files"))
    else:
        raise ValueError(f"report format must be 'md' or 'html'; got {fmt!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)  # never a half-written report under the real name
    return path
