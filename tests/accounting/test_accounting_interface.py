"""The accountants' interface: ``auto`` resolved in one place from what each accountant covers,
settings checked by name, and the calibration record's typed reads of its description."""

from __future__ import annotations

import typing

import pytest

from dpledger.accounting import (
    CalibrationRecord,
    accountant_of,
    describe,
    get_accountant,
    resolve_accountant,
)
from dpledger.accounting.accountants import ACCOUNTANTS, auto_order, settings, settings_of
from dpledger.accounting.description import SAMPLERS
from dpledger.accounting.record import AccountantResult
from dpledger.errors import ParamsError
from dpledger.mechanisms import MECHANISMS

# The table the README and the params' description state: pld for poisson and fixed sampling (a
# correlated C is then refused by pld itself), allocation for balls-in-bins with C = I, Monte Carlo
# for C != I.
DOCUMENTED_AUTO = {
    ("poisson", "identity"): "pld",
    ("fixed", "identity"): "pld",
    ("balls-in-bins", "identity"): "allocation",
    ("balls-in-bins-redrawn", "identity"): "allocation",
}


def documented(sampler: str, mechanism: str) -> str:
    if mechanism == "identity":
        return DOCUMENTED_AUTO[(sampler, mechanism)]
    return "pld" if sampler in ("poisson", "fixed") else "montecarlo"


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_auto_resolves_to_the_documented_accountant(sampler, mechanism):
    assert resolve_accountant("auto", sampler, mechanism) == documented(sampler, mechanism)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_auto_picks_an_accountant_that_covers_the_run_whenever_one_does(sampler, mechanism):
    probe = describe(sampler=sampler, dataset_size=2, batch_size=1, epochs=1, mechanism=mechanism)
    covering = [name for name in auto_order() if get_accountant(name).unsupported(probe) is None]
    chosen = resolve_accountant("auto", sampler, mechanism)
    assert (get_accountant(chosen).unsupported(probe) is None) == bool(covering)


def test_a_named_accountant_is_kept():
    assert resolve_accountant("rdp", "balls-in-bins", "banded") == "rdp"


def test_an_unknown_setting_is_refused_with_one_line_naming_it():
    with pytest.raises(ParamsError, match="discretisation") as refusal:
        get_accountant("pld", discretisation=1e-3)
    assert "\n" not in str(refusal.value)


def test_a_setting_of_another_accountant_is_ignored_and_its_own_is_used():
    pld = get_accountant("pld", samples=5000, discretization=1e-3)
    assert pld.discretization == 1e-3
    assert get_accountant("montecarlo", samples=5000, discretization=1e-3).samples == 5000


def test_the_settings_are_the_accountants_fields():
    assert settings_of("pld") == ("discretization",) and settings_of("rdp") == ()
    assert set(settings()) == {"discretization"} | set(settings_of("montecarlo"))
    assert "name" not in settings()
    assert set(ACCOUNTANTS) == {"pld", "rdp", "allocation", "montecarlo"}


def test_accountant_of_a_result_reads_only_its_settings_from_the_details():
    details = {"discretization": 1e-3, "method": "Poisson-subsampled Gaussian"}
    result = AccountantResult("pld", 1.0, 1e-5, [], details)
    assert accountant_of(result) == get_accountant("pld", discretization=1e-3)


def test_the_record_reads_its_description_through_typed_properties():
    sizes = {"dataset_size": 100, "batch_size": 10, "epochs": 2}
    description = describe(sampler="fixed", noise_multiplier=1.3, **sizes)
    record = CalibrationRecord(description, 1.0, 1e-5, "pld", [])
    described = ("noise_multiplier", "sampler", "steps", "batch_size", "dataset_size", "epochs")
    for name in (*described, "mechanism", "mechanism_params"):
        read = getattr(CalibrationRecord, name)
        assert isinstance(read, property) and "return" in typing.get_type_hints(read.fget)
        assert getattr(record, name) == getattr(description, name)
    assert "__getattr__" not in vars(CalibrationRecord)
    with pytest.raises(AttributeError):
        record.sample_rate  # noqa: B018  (the access is the test: the record does not expose it)
