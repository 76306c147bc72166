"""The report as a small tree of frozen blocks, built once and rendered to both Markdown and HTML.

Content decisions (what to show, in which order, which verdict) live in one place; the two
renderers only decide how a block looks, so the Markdown and HTML reports cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union

Tone = Literal["good", "bad", "warn", "neutral"]


@dataclass(frozen=True)
class Code:
    """Inline monospace text (a key, a command, a sampler name)."""

    text: str


@dataclass(frozen=True)
class Strong:
    """Inline emphasis."""

    text: str


@dataclass(frozen=True)
class Badge:
    """A verdict: coloured pill in HTML, emoji plus bold text in Markdown."""

    text: str
    tone: Tone


Inline = Union[str, Code, Strong, Badge]
Text = tuple[Inline, ...]


def text(*parts: Inline) -> Text:
    """A run of inline pieces (plain strings, Code, Strong, Badge)."""
    return tuple(parts)


@dataclass(frozen=True)
class Heading:
    level: int
    title: str

    @property
    def anchor(self) -> str:
        """GitHub-style anchor: lower case, spaces to hyphens, punctuation dropped."""
        kept = "".join(ch for ch in self.title.lower() if ch.isalnum() or ch in " -_")
        return kept.strip().replace(" ", "-")


@dataclass(frozen=True)
class Paragraph:
    content: Text


@dataclass(frozen=True)
class BulletList:
    items: tuple[Text, ...]


@dataclass(frozen=True)
class Table:
    """Rows of cells; a cell is a Text. ``note`` is a sentence under the table (e.g. rows left out);
    ``headline`` marks the report's main table, which HTML sets larger and full width."""

    header: tuple[str, ...]
    rows: tuple[tuple[Text, ...], ...]
    note: str = ""
    headline: bool = False


@dataclass(frozen=True)
class Figure:
    """A PNG made by a stage: ``source`` is read (HTML embeds it), ``target`` is its path beside
    report.md, ``origin`` the path a reader finds it under in the project
    (plots/<stage>/<name>.png)."""

    caption: str
    source: Path
    target: str
    origin: str


@dataclass(frozen=True)
class CodeBlock:
    code: str
    language: str = ""


@dataclass(frozen=True)
class Alert:
    """A boxed message at the top: ``caution`` for a warning, ``note`` for a notice, ``tip`` for
    all-clear."""

    kind: Literal["caution", "note", "tip"]
    title: str
    content: Text


@dataclass(frozen=True)
class Details:
    """A collapsed block (long listings a reviewer opens on demand)."""

    summary: str
    blocks: tuple["Block", ...]


Block = Union[Heading, Paragraph, BulletList, Table, Figure, CodeBlock, Alert, Details]


@dataclass(frozen=True)
class Document:
    title: str
    blocks: tuple[Block, ...]

    def figures(self) -> list[Figure]:
        """Every figure, including those inside collapsed blocks."""
        found: list[Figure] = []

        def walk(blocks: tuple[Block, ...]) -> None:
            for block in blocks:
                if isinstance(block, Figure):
                    found.append(block)
                elif isinstance(block, Details):
                    walk(block.blocks)

        walk(self.blocks)
        return found
