"""The experiment page's chart, drawn as inline SVG (pure): no plotting library at request time and
nothing for the page to load. Bars are each variant's share of its graded answers, so variants of
different sizes compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

COLOURS = ("#4e79a7", "#e8853a", "#59a14f", "#b07aa1")  # distinguishable without colour vision too (with the legend)
WIDTH, HEIGHT = 640, 270
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 34, 40


@dataclass(frozen=True)
class Series:
    name: str  # e.g. "candidate (v2)"
    counts: Sequence[int]  # per bin of equal width over [0, 1]


def _nice_top(share: float) -> float:
    """The y axis' top: the next 10% step above the largest bar (at least 10%)."""
    steps = int(share * 10 - 1e-9) + 1
    return min(1.0, max(1, steps) / 10)


def histogram_svg(series: Sequence[Series], title: str) -> Markup:
    bins = max((len(s.counts) for s in series), default=10) or 10
    shares = [[c / total if (total := sum(s.counts)) else 0.0 for c in s.counts] for s in series]
    top = _nice_top(max((x for row in shares for x in row), default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    group_w = plot_w / bins
    bar_w = group_w * 0.8 / max(1, len(series))

    def y(share: float) -> float:
        return TOP + plot_h * (1 - share / top)

    desc = "; ".join(f"{s.name}: " + ", ".join(f"{i / bins:.1f}-{(i + 1) / bins:.1f}: {c}" for i, c in
                                                enumerate(s.counts)) for s in series)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
           f'height="{HEIGHT}" role="img" aria-labelledby="chart-title chart-desc" class="chart">',
           f'<title id="chart-title">{escape(title)}</title>',
           f'<desc id="chart-desc">Answers per overall-score bin. {escape(desc)}</desc>']
    for k in range(3):  # gridlines and y labels at 0, half, top
        share = top * k / 2
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(share):.1f}" y2="{y(share):.1f}" '
                   'stroke="#ccc" stroke-width="1"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(share) + 4:.1f}" text-anchor="end" font-size="11">'
                   f'{share * 100:.0f}%</text>')
    for i in range(bins + 1):
        out.append(f'<text x="{LEFT + i * group_w:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" '
                   f'font-size="11">{i / bins:.1f}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="12">'
               'overall score</text>')
    for j, (s, row) in enumerate(zip(series, shares, strict=True)):
        colour = COLOURS[j % len(COLOURS)]
        for i, (count, share) in enumerate(zip(s.counts, row, strict=True)):
            x, top_y = LEFT + i * group_w + group_w * 0.1 + j * bar_w, y(share)
            out.append(f'<rect x="{x:.1f}" y="{top_y:.1f}" width="{bar_w:.1f}" height="{TOP + plot_h - top_y:.1f}" '
                       f'fill="{colour}"><title>{escape(s.name)}: {count} answers ({share * 100:.0f}%) scored '
                       f'{i / bins:.1f}-{(i + 1) / bins:.1f}</title></rect>')
        legend_x = LEFT + j * 180
        out.append(f'<rect x="{legend_x}" y="8" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{legend_x + 18}" y="18" font-size="12">{escape(s.name)}</text>')
    out.append('</svg>')
    return Markup("\n".join(out))
