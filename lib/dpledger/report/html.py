"""Render a report document as one self-contained HTML page.

Everything is inline: the style sheet, and every figure as a base64 PNG data URI. No script, no
external style sheet or font, and a Content-Security-Policy that forbids fetching anything, so the
page looks the same offline, in a mail attachment or in a CI artifact viewer.
"""

from __future__ import annotations

import base64
from html import escape

from dpledger.report import document as doc
from dpledger.report.renderer import Renderer

CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
ALERT_LABELS = {"caution": "Warning", "note": "Notice", "tip": "All clear"}

STYLE = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --soft: #f6f8fa;
        --good: #1a7f37; --bad: #cf222e; --warn: #9a6700; --note: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; background: #eef1f4; color: var(--fg);
       font: 15px/1.55 "Segoe UI", "Helvetica Neue", "DejaVu Sans", Arial, sans-serif; }
main { max-width: 1100px; margin: 24px auto; padding: 28px 36px 40px; background: #fff;
       border: 1px solid var(--line); border-radius: 10px; }
h1 { margin: 0 0 18px; font-size: 28px; }
h2 { margin: 34px 0 12px; padding-bottom: 6px; border-bottom: 1px solid var(--line);
     font-size: 21px; }
h3 { margin: 24px 0 8px; font-size: 17px; }
p, ul { margin: 8px 0; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.88em; }
code { background: var(--soft); padding: 1px 5px; border-radius: 4px; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px;
      padding: 12px 14px; overflow-x: auto; line-height: 1.4; }
pre code { background: none; padding: 0; font-size: 1em; }
.table-wrap { overflow-x: auto; margin: 10px 0; }
table { border-collapse: collapse; min-width: 50%; }
th, td { border: 1px solid var(--line); padding: 6px 11px; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
tbody tr:nth-child(even) td { background: #fbfcfd; }
table.headline { width: 100%; font-size: 15.5px; }
table.headline td:first-child, table.headline td:nth-child(2), th { white-space: nowrap; }
.table-note { color: var(--muted); font-style: italic; font-size: 0.9em; }
.badge { display: inline-block; padding: 1px 10px; border-radius: 999px; font-size: 0.82em;
         font-weight: 700; letter-spacing: 0.02em; white-space: nowrap; color: #fff; }
.badge.good { background: var(--good); }
.badge.bad { background: var(--bad); }
.badge.warn { background: #fff8c5; color: var(--warn); border: 1px solid #d4a72c; }
.badge.neutral { background: #eaeef2; color: var(--muted); border: 1px solid var(--line); }
.alert { margin: 10px 0; padding: 10px 16px; border-left: 6px solid; border-radius: 6px; }
.alert .label { display: block; font-size: 0.78em; font-weight: 700; text-transform: uppercase;
                letter-spacing: 0.06em; }
.alert.caution { background: #ffebe9; border-color: var(--bad); }
.alert.caution .label { color: var(--bad); }
.alert.note { background: #ddf4ff; border-color: var(--note); }
.alert.note .label { color: var(--note); }
.alert.tip { background: #dafbe1; border-color: var(--good); }
.alert.tip .label { color: var(--good); }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 16px; }
figure { margin: 0; padding: 10px; border: 1px solid var(--line); border-radius: 8px;
         background: #fff; }
figure img { display: block; width: 100%; height: auto; }
figcaption { margin-top: 6px; font-weight: 600; }
figcaption code { font-weight: normal; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--note); }
"""


def render_html(document: doc.Document) -> str:
    """The HTML page of ``document``; figures are read from their ``source`` and embedded."""
    body = [f"<h1>{escape(document.title)}</h1>"] + _HTML.blocks(document.blocks)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(document.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(body)
        + "\n</main>\n</body>\n</html>\n"
    )


class _HtmlRenderer(Renderer):
    def blocks(self, blocks: tuple[doc.Block, ...]) -> list[str]:
        """Render blocks; runs of consecutive figures share one grid."""
        out: list[str] = []
        figures: list[str] = []
        for block in blocks:
            if isinstance(block, doc.Figure):
                figures.append(self.figure(block))
                continue
            if figures:
                out.append('<div class="figures">\n' + "\n".join(figures) + "\n</div>")
                figures = []
            out.append(self.block(block))
        if figures:
            out.append('<div class="figures">\n' + "\n".join(figures) + "\n</div>")
        return out

    def heading(self, block: doc.Heading) -> str:
        return f'<h{block.level} id="{escape(block.anchor)}">{escape(block.title)}</h{block.level}>'

    def paragraph(self, block: doc.Paragraph) -> str:
        return f"<p>{self.text(block.content)}</p>"

    def bullet_list(self, block: doc.BulletList) -> str:
        return "<ul>" + "".join(f"<li>{self.text(item)}</li>" for item in block.items) + "</ul>"

    def table(self, block: doc.Table) -> str:
        attribute = ' class="headline"' if block.headline else ""
        head = "".join(f"<th>{escape(h)}</th>" for h in block.header)
        rows = "".join(
            "<tr>" + "".join(f"<td>{self.text(cell)}</td>" for cell in row) + "</tr>"
            for row in block.rows
        )
        note = f'<p class="table-note">{escape(block.note)}</p>' if block.note else ""
        table_html = (
            f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        )
        return f'<div class="table-wrap">{table_html}{note}</div>'

    def figure(self, block: doc.Figure) -> str:
        data = base64.b64encode(block.source.read_bytes()).decode("ascii")
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{escape(block.caption)}">'
            f"<figcaption>{escape(block.caption)} "
            f"<code>{escape(block.origin)}</code></figcaption></figure>"
        )

    def code_block(self, block: doc.CodeBlock) -> str:
        return f"<pre><code>{escape(block.code)}</code></pre>"

    def alert(self, block: doc.Alert) -> str:
        label = f'<span class="label">{ALERT_LABELS[block.kind]}</span>'
        return (
            f'<div class="alert {block.kind}" role="alert">{label}'
            f"<strong>{escape(block.title)}.</strong> {self.text(block.content)}</div>"
        )

    def details(self, block: doc.Details) -> str:
        inner = "\n".join(self.blocks(block.blocks))
        return f"<details><summary>{escape(block.summary)}</summary>\n{inner}\n</details>"

    def plain(self, piece: str) -> str:
        return escape(piece)

    def code(self, piece: doc.Code) -> str:
        return f"<code>{escape(piece.text)}</code>"

    def strong(self, piece: doc.Strong) -> str:
        return f"<strong>{escape(piece.text)}</strong>"

    def badge(self, piece: doc.Badge) -> str:
        return f'<span class="badge {piece.tone}">{escape(piece.text)}</span>'


_HTML = _HtmlRenderer()
