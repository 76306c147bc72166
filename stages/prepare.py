"""DVC stage `prepare` (examples/lm/dvc.yaml): the language-model example's corpus, tokenizer and
tiny causal LM into examples/lm/data (see dpledger.data.example_lm). Needs no params and downloads
nothing."""

from __future__ import annotations

from pathlib import Path

import typer

from dpledger.data.example_lm import ARCHITECTURES, EXAMPLE, write_example
from dpledger.quiet import quiet_third_party


def main(
    out: Path = typer.Option(
        Path("examples/lm/data"), help="folder to write (replaced atomically)"
    ),
    architecture: str = typer.Option("gpt2", help=f"one of {', '.join(ARCHITECTURES)}"),
) -> None:
    if architecture not in ARCHITECTURES:
        raise typer.BadParameter(
            f"allowed values are {', '.join(ARCHITECTURES)}", param_hint="--architecture"
        )
    with quiet_third_party("prepare"):
        write_example(out, architecture=architecture, **EXAMPLE)


if __name__ == "__main__":
    typer.run(main)
