"""Errors of the verify battery."""

from dpledger.errors import DpledgerError


class TrainerError(DpledgerError):
    """The trainer under test could not be loaded, or one of its runs failed."""


class BugFoundError(DpledgerError):
    """The battery found a DP-SGD implementation bug; the message lists the failed tests."""
