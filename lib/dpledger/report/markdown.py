"""Render a report document as GitHub-flavoured Markdown: readable in a pull-request diff and on
GitHub.

Warnings use GitHub's alert syntax (``> [!CAUTION]``), verdicts an emoji plus bold text, figures
relative links into ``figures/`` beside report.md.
"""

from __future__ import annotations

from dpledger.report import document as doc
from dpledger.report.renderer import Renderer

BADGE_MARKS = {"good": "✅", "bad": "❌", "warn": "⚠️", "neutral": "⚪"}
ALERT_MARKS = {"caution": "CAUTION", "note": "NOTE", "tip": "TIP"}
_ESCAPED = "\\`*<>[]"


def render_markdown(document: doc.Document) -> str:
    """The Markdown text of ``document`` (ends with a newline)."""
    parts = [f"# {_escape(document.title)}"] + [_MARKDOWN.block(block) for block in document.blocks]
    return "\n\n".join(parts) + "\n"


class _MarkdownRenderer(Renderer):
    def heading(self, block: doc.Heading) -> str:
        return f"{'#' * block.level} {_escape(block.title)}"

    def paragraph(self, block: doc.Paragraph) -> str:
        return self.text(block.content)

    def bullet_list(self, block: doc.BulletList) -> str:
        return "\n".join(f"- {self.text(item)}" for item in block.items)

    def table(self, block: doc.Table) -> str:
        lines = [
            "| " + " | ".join(_cell(_escape(h)) for h in block.header) + " |",
            "|" + "|".join("---" for _ in block.header) + "|",
        ]
        lines += [
            "| " + " | ".join(_cell(self.text(cell)) for cell in row) + " |" for row in block.rows
        ]
        if block.note:
            lines += ["", f"*{_escape(block.note)}*"]
        return "\n".join(lines)

    def figure(self, block: doc.Figure) -> str:
        return (
            f"**{_escape(block.caption)}** "
            f"(`{block.origin}`)\n\n![{_escape(block.caption)}]({block.target})"
        )

    def code_block(self, block: doc.CodeBlock) -> str:
        return f"```{block.language}\n{block.code}\n```"

    def alert(self, block: doc.Alert) -> str:
        body = f"**{_escape(block.title)}.** {self.text(block.content)}"
        return f"> [!{ALERT_MARKS[block.kind]}]\n" + "\n".join(
            f"> {line}" for line in body.splitlines()
        )

    def details(self, block: doc.Details) -> str:
        inner = "\n\n".join(self.block(b) for b in block.blocks)
        return f"<details><summary>{_escape(block.summary)}</summary>\n\n{inner}\n\n</details>"

    def plain(self, piece: str) -> str:
        return _escape(piece)

    def code(self, piece: doc.Code) -> str:
        fence = "``" if "`" in piece.text else "`"
        return f"{fence}{piece.text}{fence}" if piece.text else ""

    def strong(self, piece: doc.Strong) -> str:
        return f"**{_escape(piece.text)}**" if piece.text else ""

    def badge(self, piece: doc.Badge) -> str:
        return f"{BADGE_MARKS[piece.tone]} **{_escape(piece.text)}**"


_MARKDOWN = _MarkdownRenderer()


def _cell(rendered: str) -> str:
    return rendered.replace("|", "\\|").replace("\n", " ") or " "


def _escape(plain: str) -> str:
    return "".join(f"\\{ch}" if ch in _ESCAPED else ch for ch in plain)
