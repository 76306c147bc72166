"""One dispatch from a report block to the method that draws it, shared by the Markdown and HTML
renderers.

A renderer subclasses :class:`Renderer` and writes one method per kind of block and inline piece,
named in the tables below; a subclass that lacks one fails when it is defined, so a new kind of
block cannot be drawn by one format and silently dropped by the other.
"""

from __future__ import annotations

from dpledger.report import document as doc

_BLOCK_METHODS = {
    doc.Heading: "heading",
    doc.Paragraph: "paragraph",
    doc.BulletList: "bullet_list",
    doc.Table: "table",
    doc.Figure: "figure",
    doc.CodeBlock: "code_block",
    doc.Alert: "alert",
    doc.Details: "details",
}
_INLINE_METHODS = {str: "plain", doc.Code: "code", doc.Strong: "strong", doc.Badge: "badge"}


class Renderer:
    """Draws a :class:`~dpledger.report.document.Document` in one format, one method per kind of
    piece."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [
            name
            for name in (*_BLOCK_METHODS.values(), *_INLINE_METHODS.values())
            if not hasattr(cls, name)
        ]
        if missing:
            raise TypeError(f"renderer {cls.__name__} does not draw: {', '.join(missing)}")

    def block(self, block: doc.Block) -> str:
        return getattr(self, _method(_BLOCK_METHODS, block, "block"))(block)

    def text(self, content: doc.Text) -> str:
        return "".join(
            getattr(self, _method(_INLINE_METHODS, piece, "inline"))(piece) for piece in content
        )


def _method(methods: dict[type, str], piece: object, kind: str) -> str:
    name = methods.get(type(piece))
    if name is None:
        raise TypeError(f"unknown {kind} {type(piece).__name__}")
    return name
