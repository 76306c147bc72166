"""Nothing runs from a model or tokenizer folder: transformers is always called with
``trust_remote_code=False``, and a folder that asks for its own code is refused with one line naming
the file, before transformers reads it.

A ``config.json``, ``tokenizer_config.json`` (or any other ``*config.json`` transformers reads, such
as ``preprocessor_config.json``) with an ``auto_map`` names Python classes shipped in the folder;
transformers would import and run them (and, where ``trust_remote_code`` is left unset, ask on the
terminal first: a prompt in the middle of ``dvc repro``). dpledger loads only the architectures
transformers itself ships.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpledger.errors import ParamsError

TRUST_REMOTE_CODE = False
"""What every transformers ``from_pretrained``/``from_config`` call in dpledger is given."""


def refuse_remote_code(folder: str | Path, key: str) -> None:
    """One line naming the first config file in ``folder`` with an auto_map (code in the folder)."""
    for path in sorted(Path(folder).glob("*config.json")):
        try:
            content = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # transformers reports an unreadable config itself (one line, via the caller)
        if isinstance(content, dict) and "auto_map" in content:
            raise ParamsError(
                f"params: {key} = {str(folder)!r} is invalid: {path} has an auto_map, "
                "which would run Python code from the folder; "
                "dpledger loads only architectures transformers ships "
                "(remove auto_map and use a built-in model_type)"
            )


def refuse_remote_code_spec(spec: dict[str, Any], key: str) -> None:
    """The same for a config given inline (``train.model_options.config``)."""
    if "auto_map" in spec:
        raise ParamsError(
            f"params: {key} is invalid: auto_map would run Python code; "
            "use a model_type transformers ships"
        )
