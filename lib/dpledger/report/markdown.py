"""Render a report document as GitHub-flavoured Markdown: readable in a pull-request diff and on GitHub.

Warnings use GitHub's alert syntax (``> [!CAUTION]``), verdicts an emoji plus bold text, figures
relative links into ``figures/`` beside report.md.
"""

from __future__ import annotations

from dpledger.report.document import (
    Alert,
    Badge,
    Block,
    BulletList,
    Code,
    CodeBlock,
    Details,
    Document,
    Figure,
    Heading,
    Inline,
    Paragraph,
    Strong,
    Table,
    Text,
)

BADGE_MARKS = {"good": "✅", "bad": "❌", "warn": "⚠️", "neutral": "⚪"}
ALERT_MARKS = {"caution": "CAUTION", "note": "NOTE", "tip": "TIP"}
_ESCAPED = "\\`*<>[]"


def render_markdown(document: Document) -> str:
    """The Markdown text of ``document`` (ends with a newline)."""
    parts = [f"# {_escape(document.title)}"] + [_block(block) for block in document.blocks]
    return "\n\n".join(parts) + "\n"


def _block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"{'#' * block.level} {_escape(block.title)}"
    if isinstance(block, Paragraph):
        return _text(block.content)
    if isinstance(block, BulletList):
        return "\n".join(f"- {_text(item)}" for item in block.items)
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Figure):
        return f"**{_escape(block.caption)}** (`{block.origin}`)\n\n![{_escape(block.caption)}]({block.target})"
    if isinstance(block, CodeBlock):
        return f"```{block.language}\n{block.code}\n```"
    if isinstance(block, Alert):
        body = f"**{_escape(block.title)}.** {_text(block.content)}"
        return f"> [!{ALERT_MARKS[block.kind]}]\n" + "\n".join(f"> {line}" for line in body.splitlines())
    if isinstance(block, Details):
        inner = "\n\n".join(_block(b) for b in block.blocks)
        return f"<details><summary>{_escape(block.summary)}</summary>\n\n{inner}\n\n</details>"
    raise TypeError(f"unknown block {type(block).__name__}")


def _table(table: Table) -> str:
    lines = [
        "| " + " | ".join(_cell(_escape(h)) for h in table.header) + " |",
        "|" + "|".join("---" for _ in table.header) + "|",
    ]
    lines += ["| " + " | ".join(_cell(_text(cell)) for cell in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", f"*{_escape(table.note)}*"]
    return "\n".join(lines)


def _cell(rendered: str) -> str:
    return rendered.replace("|", "\\|").replace("\n", " ") or " "


def _text(content: Text) -> str:
    return "".join(_inline(piece) for piece in content)


def _inline(piece: Inline) -> str:
    if isinstance(piece, str):
        return _escape(piece)
    if isinstance(piece, Code):
        fence = "``" if "`" in piece.text else "`"
        return f"{fence}{piece.text}{fence}" if piece.text else ""
    if isinstance(piece, Strong):
        return f"**{_escape(piece.text)}**" if piece.text else ""
    if isinstance(piece, Badge):
        return f"{BADGE_MARKS[piece.tone]} **{_escape(piece.text)}**"
    raise TypeError(f"unknown inline {type(piece).__name__}")


def _escape(plain: str) -> str:
    return "".join(f"\\{ch}" if ch in _ESCAPED else ch for ch in plain)
