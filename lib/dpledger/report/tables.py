"""Tables shared by the report's sections: key/value listings, records, and any JSON document as it
is."""

from __future__ import annotations

from typing import Any, Callable

from dpledger.report.document import Badge, Block, Code, Details, Paragraph, Table, text
from dpledger.report.formatting import flatten, format_exact, format_for_key, is_table
from dpledger.report.inputs import ReportInputs

MAX_TABLE_ROWS = 25
NOT_RUN = Badge("not run", "neutral")


def metrics_table(stage: str, inputs: ReportInputs, summary: str) -> list[Block]:
    """A stage's flat metrics at full precision, collapsed; or why there are none."""
    if not inputs.ran(stage):
        return [Paragraph(text(NOT_RUN, f" metrics/{stage}.json: {inputs.status[stage]}."))]
    return [Details(summary, (key_value_table(list(inputs.metrics[stage].items()), exact=True),))]


def key_value_table(pairs: list[tuple[str, Any]], exact: bool = False) -> Table:
    """Keys and values; ``exact`` shows every digit (a metrics file), else values are rounded by
    meaning."""
    rows = tuple(
        (text(Code(key)), text(format_exact(value) if exact else format_for_key(key, value)))
        for key, value in pairs[:MAX_TABLE_ROWS]
    )
    return Table(("key", "value"), rows, note=_left_out(len(pairs)))


def records_table(
    records: list[dict[str, Any]], cell: Callable[[str, Any], str] = format_for_key
) -> Table:
    """A list of dicts as a table, one column per key (in order of first appearance); ``cell(key,
    value)`` formats."""
    columns: list[str] = []
    for record in records:
        columns.extend(key for key in record if key not in columns)
    rows = tuple(tuple(text(cell(c, r.get(c))) for c in columns) for r in records[:MAX_TABLE_ROWS])
    return Table(tuple(columns), rows, note=_left_out(len(records)))


def _left_out(count: int) -> str:
    return f"{count - MAX_TABLE_ROWS} more rows not shown." if count > MAX_TABLE_ROWS else ""


def json_blocks(content: Any) -> list[Block]:
    """Show an arbitrary JSON document as it is: its scalars as one table, each list of records as
    its own."""
    if is_table(content):
        return [records_table(content)]
    pairs = flatten(content)
    blocks: list[Block] = []
    scalars = [(k, v) for k, v in pairs if not is_table(v)]
    if scalars:
        blocks.append(key_value_table(scalars))
    for key, value in pairs:
        if is_table(value):
            blocks.extend([Paragraph(text(Code(key), ":")), records_table(value)])
    return blocks
