"""The engine's self-check (issue 26): on the user's own model, the engine's per-example norms and
clipped sum against a naive per-example autograd loop; a wrong per-layer rule is refused, naming its
layer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine, SelfCheckError, run_self_check
from dpledger.engine import self_check as self_check_module
from dpledger.engine.layers import RULES
from dpledger.engine.layers.linear import RULE as LINEAR_RULE
from dpledger.errors import DpledgerError, ParamsError
from dpledger.models import build_model
from helpers import wrong_rules
from helpers.wrong_rules import (
    WRONG_RULE,
    NudgedLinear,
    make_float32_blind_model,
    make_nudged_model,
)


def classification_loss(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none")


def _images(n=5, classes=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 8, 8, generator=generator)
    return images, torch.randint(0, classes, (n,), generator=generator)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("clipping", ["flat", "per-layer", "automatic"])
def test_self_check_passes_on_the_zoo_models_in_float64(name, clipping):
    torch.manual_seed(0)
    options = {"dim": 16, "depth": 1} if name == "transformer" else {}
    model = build_model(name, (1, 8, 8), 4, **options)
    x, y = _images()
    result = run_self_check(model, classification_loss, x, y, clip_norm=0.05, clipping=clipping)
    assert result.passed and result.dtype == "float64" and result.tolerance == 1e-9
    assert result.max_relative_error < 1e-12
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert result.parameters_checked == result.parameters_trainable == trainable
    assert result.examples == 5 and result.padding_rows == 1
    assert set(result.to_dict()) >= {
        "max_relative_error",
        "worst_parameters",
        "examples",
        "seconds",
        "dtype",
    }


def _gpt2(dropout=0.1):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=40,
        n_positions=16,
        n_embd=8,
        n_layer=2,
        n_head=2,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config)


def _bert(dropout=0.1):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=40,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=3,
        attn_implementation="eager",
    )
    return transformers.BertForSequenceClassification(config)


def lm_loss(model, ids, _):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean(1)


def sequence_loss(model, ids, labels):
    return F.cross_entropy(model(input_ids=ids).logits, labels, reduction="none")


@pytest.mark.parametrize("build,loss", [(_gpt2, lm_loss), (_bert, sequence_loss)])
def test_self_check_passes_on_tiny_hf_models_with_dropout_on_and_leaves_them_unchanged(build, loss):
    torch.manual_seed(0)
    model = build().train()
    before = copy.deepcopy(model.state_dict())
    random_state = torch.random.get_rng_state()
    ids = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 0])
    result = run_self_check(model, loss, ids, labels, clip_norm=0.5)
    assert result.passed and result.max_relative_error < 1e-10
    assert result.parameters_checked == sum(1 for _ in model.parameters())  # GPT-2's tied head once
    assert model.training
    assert all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    assert any(isinstance(m, nn.Dropout) and m.p == 0.1 for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(random_state, torch.random.get_rng_state())  # training draws as without it


def test_a_rule_five_percent_off_is_refused_naming_its_layer():
    torch.manual_seed(0)
    model = make_nudged_model((1, 8, 8), 4)
    x, y = _images()
    with pytest.raises(SelfCheckError, match=r"layer\(s\) 3 \(NudgedLinear\).*3\.weight") as caught:
        run_self_check(model, classification_loss, x, y, clip_norm=1e3)
    assert isinstance(caught.value, DpledgerError) and "\n" not in str(caught.value)
    assert "1.weight" not in str(caught.value)  # the correct Linear is not blamed


def test_the_failure_path_returns_the_record_when_asked_and_names_the_worst_parameter():
    torch.manual_seed(0)
    model = make_nudged_model((1, 8, 8), 4)
    x, y = _images()
    loss = classification_loss
    result = run_self_check(model, loss, x, y, clip_norm=1e3, raise_on_mismatch=False)
    assert not result.passed
    assert result.worst_parameters[0].name == "3.weight"
    # unclipped (R large): the weight's sum is exactly 5 % off relative to itself
    assert result.sum_relative_error > 0.01 and result.worst_parameters[0].relative_error > 0.01
    assert result.worst_parameters[-1].relative_error < 1e-12  # the other parameters are exact
    assert result.failure().startswith("self-check: ") and "3.weight" in result.failure()


def test_the_standalone_api_checks_an_attached_engine_and_leaves_it_training_as_before():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4).double()
    twin = copy.deepcopy(model)
    x, y = _images()
    x = x.double()
    options = dict(clip_norm=0.1, noise_multiplier=0.0, normalizer=1.0, clipping="per-layer")
    engine = BKEngine(model, None, **options)
    result = engine.self_check(classification_loss, x, y)
    assert result.passed and result.clipping == "per-layer"
    assert not any(p.requires_grad for p in model.parameters())  # the engine's state is kept
    engine.private_step(classification_loss(model, x, y))
    after_check = [p.grad.clone() for p in engine.params]
    fresh = BKEngine(twin, None, **options)
    fresh.private_step(classification_loss(twin, x, y))
    assert all(torch.equal(a, p.grad) for a, p in zip(after_check, fresh.params))


def test_the_standalone_api_refuses_a_wrong_rule():
    torch.manual_seed(0)
    model = make_nudged_model((1, 8, 8), 4)
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    with pytest.raises(SelfCheckError, match="NudgedLinear"):
        engine.self_check(classification_loss, *_images())


def test_only_the_trainable_set_is_checked_and_frozen_parameters_stay_frozen():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4)
    first = next(model.parameters())
    first.requires_grad_(False)
    result = run_self_check(model, classification_loss, *_images(), clip_norm=0.1)
    assert result.passed and result.parameters_checked == sum(1 for p in model.parameters()) - 1
    assert not first.requires_grad


def test_a_subset_of_parameters_bounds_the_cost_and_unknown_patterns_are_refused():
    torch.manual_seed(0)
    model = make_nudged_model((1, 8, 8), 4)
    x, y = _images()
    result = run_self_check(model, classification_loss, x, y, clip_norm=1e3, only=["1.*"])
    assert result.passed and result.parameters_checked == 2 and result.parameters_trainable == 4
    with pytest.raises(SelfCheckError, match="NudgedLinear"):
        run_self_check(model, classification_loss, x, y, clip_norm=1e3, only=["3.weight"])
    with pytest.raises(ParamsError, match="match no trainable parameter"):
        run_self_check(model, classification_loss, x, y, clip_norm=1.0, only=["nothing.*"])


def test_float32_precision_has_its_own_stated_tolerance_and_still_catches_a_wrong_rule():
    torch.manual_seed(0)
    x, y = _images()
    good = run_self_check(
        build_model("cnn", (1, 8, 8), 4),
        classification_loss,
        x,
        y,
        clip_norm=0.1,
        precision="float32",
    )
    assert good.passed and good.dtype == "float32" and good.tolerance == 1e-3
    assert good.max_relative_error < 1e-5
    with pytest.raises(SelfCheckError, match="float32"):
        run_self_check(
            make_nudged_model((1, 8, 8), 4),
            classification_loss,
            x,
            y,
            clip_norm=1e3,
            precision="float32",
        )


def test_a_rule_wrong_only_in_float32_passes_in_float64_and_is_caught_in_the_training_dtype():
    torch.manual_seed(0)
    model = make_float32_blind_model((1, 8, 8), 4)
    x, y = _images()
    loss = classification_loss
    result = run_self_check(model, loss, x, y, clip_norm=0.05, raise_on_mismatch=False)
    assert result.dtype == "float64" and result.within_tolerance()  # the float64 proof is fooled
    assert result.max_relative_error < 1e-12
    training = result.training
    assert training.dtype == "float32" and training.tolerance == 1e-3 and not training.passed
    assert training.norm_relative_error > 0.01 and not result.passed  # whole norm, both layers
    record = result.to_dict()
    assert record["training_dtype"] == "float32" and record["training_passed"] is False
    assert record["training_max_relative_error"] == training.max_relative_error > 1e-2
    pattern = r"self-check in the training dtype \(the float64 check passed\): .*Float32BlindLinear"
    with pytest.raises(SelfCheckError, match=pattern) as caught:
        run_self_check(model, loss, x, y, clip_norm=0.05)
    assert "float32, tolerance 0.001" in str(caught.value) and "\n" not in str(caught.value)


def test_the_training_dtype_comparison_is_recorded_beside_the_float64_one():
    torch.manual_seed(0)
    x, y = _images()
    model = build_model("mlp", (1, 8, 8), 4)
    result = run_self_check(model, classification_loss, x, y, clip_norm=0.1)
    assert result.passed and result.dtype == "float64" and result.training.dtype == "float32"
    assert result.training.passed and result.training.max_relative_error < 1e-5
    assert result.to_dict()["training_max_relative_error"] == result.training.max_relative_error
    only = run_self_check(model, classification_loss, x, y, clip_norm=0.1, precision="training")
    assert only.dtype == "float32" and only.training is None and only.passed
    as_double = run_self_check(model.double(), classification_loss, x, y, clip_norm=0.1)
    assert as_double.training.dtype == "float64"  # training's precision is the proof's: run once
    assert as_double.to_dict()["training_max_relative_error"] == as_double.max_relative_error


def test_bf16_autocast_is_the_training_precision_with_its_own_tolerance(monkeypatch):
    torch.manual_seed(0)
    x, y = _images()
    model = build_model("mlp", (1, 8, 8), 4)
    loss = classification_loss
    result = run_self_check(model, loss, x, y, clip_norm=0.1, autocast=torch.bfloat16)
    assert result.passed and result.training.dtype == "bfloat16 autocast"
    assert result.training.tolerance == 5e-2 and 0 < result.training.max_relative_error < 5e-2
    monkeypatch.setattr(wrong_rules, "WRONG_FACTOR", 1.2)  # 20 % off: bf16 catches it
    with pytest.raises(SelfCheckError, match="NudgedLinear"):
        run_self_check(
            make_nudged_model((1, 8, 8), 4),
            loss,
            x,
            y,
            clip_norm=1e3,
            precision="training",
            autocast=torch.bfloat16,
        )


def test_without_memory_for_a_copy_it_is_refused_pointing_at_the_parameter_subset(monkeypatch):
    monkeypatch.setattr(self_check_module, "_available_bytes", lambda device: 1000)
    model = build_model("mlp", (1, 8, 8), 4)
    with pytest.raises(SelfCheckError, match="self_check_parameters"):
        run_self_check(model, classification_loss, *_images(), clip_norm=1.0)


def test_float64_falls_back_to_float32_when_only_that_fits(monkeypatch):
    model = build_model("mlp", (1, 8, 8), 4)
    names = [n for n, _ in model.named_parameters()]
    float32_bytes = self_check_module._copy_bytes(model, names, torch.float32)
    monkeypatch.setattr(self_check_module, "_available_bytes", lambda device: 3 * float32_bytes)
    result = run_self_check(model, classification_loss, *_images(), clip_norm=1.0)
    assert result.passed and result.dtype == "float32"


class _BatchMixer(nn.Module):
    """Subtracts the batch mean: each example's loss depends on the others (per-example DP does not
    hold)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 4)

    def forward(self, x):
        h = self.linear(x.flatten(1))
        return h - h.mean(0, keepdim=True)


def test_a_model_that_mixes_examples_is_refused_by_its_losses():
    torch.manual_seed(0)
    with pytest.raises(SelfCheckError, match="mixes examples"):
        run_self_check(_BatchMixer(), classification_loss, *_images(), clip_norm=1.0)


def test_padding_rows_and_weights_reach_the_engine_and_the_loop_alike():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4)
    x, y = _images()
    weights = torch.tensor([1.0, 0.0, 2.5, 1.0, 0.5])
    result = run_self_check(model, classification_loss, x, y, weights, clip_norm=0.05)
    assert result.passed and result.max_relative_error < 1e-12


def test_the_wrong_rule_is_registered_for_the_test_class_only():
    assert RULES[NudgedLinear] is WRONG_RULE and RULES[nn.Linear] is LINEAR_RULE


class _KeyBiasAttention(nn.Module):
    """Attention scores q·(W·x_t + b) over the tokens t: the key bias b shifts every score equally,
    so softmax cancels its gradient exactly and both computations give round-off only."""

    def __init__(self) -> None:
        super().__init__()
        self.key = nn.Linear(16, 16)  # 2T² < p·d: ghost norm and book-keeping, not the loop's order
        self.query = nn.Parameter(torch.randn(16))
        self.value = nn.Linear(16, 3)

    def forward(self, x):
        weights = torch.softmax(self.key(x) @ self.query, dim=1)
        return (weights.unsqueeze(-1) * self.value(x)).sum(1)


def test_a_gradient_that_cancels_exactly_is_not_a_mismatch(monkeypatch):
    torch.manual_seed(3)
    model = _KeyBiasAttention()
    x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(4))
    y = torch.tensor([0, 1, 2, 0])
    result = run_self_check(model, classification_loss, x, y, clip_norm=0.5)
    assert result.passed and result.max_relative_error < 1e-10
    monkeypatch.setitem(self_check_module.ZERO_GRADIENT_FLOOR, torch.float64, 0.0)  # to itself
    loss = classification_loss
    unfloored = run_self_check(model, loss, x, y, clip_norm=0.5, raise_on_mismatch=False)
    assert not unfloored.passed and unfloored.worst_parameters[0].name == "key.bias"
