"""DVC stage entrypoints: ``python -m stages.<name>``. Each is a thin typer wrapper over
dpledger.pipeline."""
