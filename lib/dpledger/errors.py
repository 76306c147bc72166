"""Errors a user can act on: each carries a one-line message naming what to change."""


class DpledgerError(Exception):
    """Base class for every error dpledger reports to a user as one line, without a traceback."""


class ParamsError(DpledgerError):
    """A value in params.yaml (or a CLI flag) is missing, unknown or out of range."""


class UnsupportedMechanismError(DpledgerError):
    """No sound accountant exists for the described mechanism; the message says what to use
    instead."""


class SamplerMismatchError(DpledgerError):
    """The sampler that produced the batches differs from the one the accountant assumed."""
