"""How numbers and JSON values read in the report: short, stable across runs, never flattering.

A claimed epsilon is rounded *up* at display precision and an empirical lower bound *down*, so
the rendered report never shows a smaller claimed epsilon than was proven, nor a stronger audit
result than was measured.
"""

from __future__ import annotations

import json
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

MISSING = "—"
SIGNIFICANT_DIGITS = 4
_TEXT_LIMIT = 160
_LIST_LIMIT = 6
_GROUPED_FROM = 10_000


def format_value(value: Any) -> str:
    """A scalar (or small JSON value) as short text: 4 significant digits, ints exact, bools
    yes/no."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= _GROUPED_FROM else str(value)
    if isinstance(value, float):
        return _format_float(value, rounding=None)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) > _LIST_LIMIT:
        shown = ", ".join(format_value(item) for item in value[:_LIST_LIMIT])
        return f"[{shown}, … ({len(value)} items)]"
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 1] + "…"


def format_upper(value: Any) -> str:
    """A bound that must not be understated (a claimed epsilon): rounded up at display precision."""
    return _format_float(value, rounding=ROUND_CEILING) if _is_real(value) else format_value(value)


def format_lower(value: Any) -> str:
    """A bound that must not be overstated (an empirical lower bound): rounded down."""
    return _format_float(value, rounding=ROUND_FLOOR) if _is_real(value) else format_value(value)


def format_percent(value: Any) -> str:
    """A fraction in [0, 1] as a percentage; anything else as a plain value."""
    if _is_real(value) and 0.0 <= value <= 1.0:
        return f"{100.0 * value:.{SIGNIFICANT_DIGITS}g} %"
    return format_value(value)


def format_exact(value: Any) -> str:
    """Every digit of a number (the full-precision metrics listings); other values as
    format_value."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return format_value(value)


def format_for_key(key: str, value: Any) -> str:
    """Round by meaning: an empirical or lower-bound epsilon down, any other epsilon up, the rest
    plainly."""
    name = key.lower()
    if "epsilon" in name or name in {"ε", "eps"}:
        return format_lower(value) if ("emp" in name or "lower" in name) else format_upper(value)
    return format_value(value)


def format_change(old: Any, new: Any) -> str:
    """new − old for two numbers (signed), 'changed' for differing non-numbers, '' when equal."""
    if old == new:
        return ""
    if _is_real(old) and _is_real(new):
        return ("+" if new > old else "−") + format_value(abs(float(new) - float(old)))
    return "changed"


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _format_float(value: float, rounding: str | None) -> str:
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if value == 0.0:
        return "0"
    if rounding is not None:
        value = _round_significant(value, rounding)
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e6:
        return f"{value:.{SIGNIFICANT_DIGITS}g}"
    mantissa, exponent = f"{value:.{SIGNIFICANT_DIGITS - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _round_significant(value: float, rounding: str) -> float:
    exponent = math.floor(math.log10(abs(value))) - SIGNIFICANT_DIGITS + 1
    quantum = Decimal(1).scaleb(exponent)
    # repr is the shortest text that reads back as the same float: 0.83 stays 0.83, not 0.8299…
    return float(Decimal(repr(value)).quantize(quantum, rounding=rounding))


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) pairs of the scalars in nested dicts; lists stay whole (shown
    compactly)."""
    if not isinstance(value, dict):
        return [(prefix or "value", value)]
    pairs: list[tuple[str, Any]] = []
    for key, inner in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(inner, dict) and inner:
            pairs.extend(flatten(inner, name))
        else:
            pairs.append((name, inner))
    return pairs


def is_table(value: Any) -> bool:
    """True for a non-empty list of dicts: rendered as a table rather than inline."""
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


_WORDS = {
    "epsilon": "ε",
    "eps": "ε",
    "delta": "δ",
    "sigma": "σ",
    "rmse": "RMSE",
    "emp": "(empirical)",
    "n": "N",
}


def humanize(name: str) -> str:
    """'epsilon_vs_step' -> 'ε vs step', 'rmse_vs_epsilon' -> 'RMSE vs ε' (file names as
    captions)."""
    words = name.replace("_", " ").replace("-", " ").split()
    if words and words[0].lower() not in _WORDS:
        words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(_WORDS.get(word.lower(), word) for word in words)
