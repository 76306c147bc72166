"""JSON that any parser reads: JSON has no Infinity or NaN, so ``--json`` output spells them as
strings."""

from __future__ import annotations

import json
import math
from typing import Any


def jsonable(value: Any) -> Any:
    """``value`` with every non-finite float replaced by the string "inf", "-inf" or "nan",
    containers recursively (numpy scalars become floats first)."""
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def dumps(value: Any) -> str:
    """Indented strict JSON of ``value``; values json cannot encode (numpy scalars) go through
    float."""
    return json.dumps(
        jsonable(json.loads(json.dumps(value, default=float))), indent=2, allow_nan=False
    )
