"""The accountants' registry is read from the modules of ``dpledger.accounting.accountants``: each
module is one accountant implementing the whole interface, and the names params.yaml, the CLI and
``auto`` use are that package's, restated nowhere."""

from __future__ import annotations

import inspect
import pkgutil
from typing import get_args

import pytest

from dpledger.accounting import accountants
from dpledger.accounting.accountants import ACCOUNTANTS, accountant_type, auto_order
from dpledger.accounting.accountants.base import Accountant
from dpledger.cli.accounting import AccountantName
from dpledger.params.calibrate import CalibrateParams

INTERFACE = ("unsupported", "epsilon", "delta", "calibrate", "curve_epsilon")
CLASS_FACTS = ("deterministic", "auto_rank", "printed_bounds")


def test_the_names_are_the_package_modules_less_the_interface():
    modules = {m.name for m in pkgutil.iter_modules(accountants.__path__)}
    assert set(ACCOUNTANTS) == modules - {"base"}


@pytest.mark.parametrize("name", ACCOUNTANTS)
def test_each_module_is_one_accountant_with_the_whole_interface(name):
    kind = accountant_type(name)
    instance = kind()
    assert instance.name == name
    for method in INTERFACE:
        ours = inspect.signature(getattr(kind, method))
        protocol = inspect.signature(getattr(Accountant, method))
        assert list(ours.parameters)[: len(protocol.parameters)] == list(protocol.parameters)
    for fact in CLASS_FACTS:
        assert fact in vars(kind), f"{name} does not declare {fact}"


def test_auto_tries_the_ranked_accountants_in_rank_order():
    ranks = [accountant_type(name).auto_rank for name in auto_order()]
    assert ranks == sorted(ranks) and None not in ranks
    unranked = {n for n in ACCOUNTANTS if accountant_type(n).auto_rank is None}
    assert set(auto_order()) == set(ACCOUNTANTS) - unranked


def test_params_and_the_cli_accept_exactly_the_registered_names():
    assert get_args(CalibrateParams.model_fields["accountant"].annotation) == ("auto", *ACCOUNTANTS)
    option = get_args(AccountantName)[1]
    assert option.help == " | ".join(("auto", *ACCOUNTANTS))
