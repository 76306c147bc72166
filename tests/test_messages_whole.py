"""Every message literal is made of whole sentences: an implicit concatenation of string literals
(``"a " "b"``) may only be cut where a sentence or a clause ends.

The rule, precisely: in lib/, stages/ and benchmarks/, every string expression the AST holds is
split into the literal tokens written one after the other (its *pieces*). Between two pieces the
cut is whole when the first piece's literal text, after its last replacement field and less
trailing spaces, ends in one of ``. , ; : ! ? ) ] | — – >`` or a newline, or when the second
piece's literal text, before its first replacement field and less leading spaces, starts with one
of ``. , ; : ! ? ) ( | — – <`` (a parenthetical aside, a table cell, an HTML tag). A piece that
ends on a replacement field ends on no boundary. Anything else (a cut after ``"to"``, between a
word and a number, inside a tag) is a fragment: the 100-column formatter made those, and a reader
grepping for a message cannot find it. A clause longer than the line is kept whole on its own line
(``# noqa: E501``).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "lib" / "dpledger", REPO / "stages", REPO / "benchmarks")
ENDS = (".", ",", ";", ":", "!", "?", ")", "]", "|", "—", "–", ">", "\n")
STARTS = (".", ",", ";", ":", "!", "?", ")", "(", "|", "—", "–", "<")


def pieces(source: str) -> list[str]:
    """The string literal tokens of a string expression's source, in order."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t.string for t in tokens if t.type == tokenize.STRING]


def literal_ends(piece: str) -> tuple[str, str]:
    """(the literal text before the first replacement field, the text after the last one)."""
    node = ast.parse(piece, mode="eval").body
    if isinstance(node, ast.Constant):
        text = node.value if isinstance(node.value, str) else ""
        return text, text
    parts = node.values
    head = parts[0].value if parts and isinstance(parts[0], ast.Constant) else ""
    tail = parts[-1].value if parts and isinstance(parts[-1], ast.Constant) else ""
    return head, tail


def whole_cut(first: str, second: str) -> bool:
    """Whether the cut between two adjacent pieces falls at a sentence or clause boundary."""
    tail = literal_ends(first)[1].rstrip(" ")
    head = literal_ends(second)[0].lstrip(" ")
    return tail.endswith(ENDS) or head.startswith(STARTS)


def string_nodes(tree: ast.AST) -> list[ast.expr]:
    """The outermost string expressions of ``tree`` (not the parts inside an f-string)."""
    inner = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in ast.walk(node)
        if part is not node
    }
    return [
        node
        for node in ast.walk(tree)
        if id(node) not in inner
        and (
            isinstance(node, ast.JoinedStr)
            or (isinstance(node, ast.Constant) and isinstance(node.value, str))
        )
    ]


def fragments(path: Path) -> list[str]:
    """``file:line: "piece" | "next"`` for every cut of ``path`` that is not whole."""
    source = path.read_text()
    found = []
    for node in string_nodes(ast.parse(source)):
        segment = ast.get_source_segment(source, node)
        literals = pieces(segment or "")
        for first, second in zip(literals, literals[1:]):
            if not whole_cut(first, second):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {first} | {second}")
    return found


def test_the_rule_tells_a_fragment_from_a_whole_cut():
    assert not whole_cut('"the accountant covers poisson, and "', '"fixed sampling"')
    assert not whole_cut('f"calibrate.mc_samples (now "', 'f"{samples})"')
    assert not whole_cut('f"σ = {sigma:.3g}"', '" added to the sum"')
    assert whole_cut('"the claim is refused; "', '"re-run calibrate"')
    assert whole_cut('f"δ = {delta:g}"', '"; use a smaller δ"')
    assert whole_cut('"first line\\n"', '"second line"')
    assert whole_cut('f"{n} examples take {b} batches "', '"(give one of the two)"')
    assert not whole_cut('"(give one of "', '"the two)"')
    assert whole_cut('f"<figcaption>{caption} "', '"<code>origin</code>"')
    assert not whole_cut('"<div role=\\"alert\\"><span "', '"class=\\"label\\">"')


def test_no_message_literal_is_cut_into_fragments():
    found = [f for root in ROOTS for path in sorted(root.rglob("*.py")) for f in fragments(path)]
    assert found == [], f"{len(found)} fragmentary cuts:\n" + "\n".join(found)
