"""Model zoo: shapes, option errors, and exact BK clipping through every model."""

from __future__ import annotations

import pytest
import torch

from dpledger.errors import ParamsError
from dpledger.models import build_model
from helpers.engine_checks import compare, cross_entropy


@pytest.mark.parametrize(
    "name,opts",
    [
        ("mlp", {"hidden": [8, 8]}),
        ("cnn", {"channels": [4, 8]}),
        ("transformer", {"dim": 8, "depth": 2, "heads": 2}),
    ],
)
def test_every_model_maps_images_to_logits_and_bk_clips_it_exactly(name, opts):
    torch.manual_seed(0)
    model = build_model(name, (1, 8, 8), 10, **opts)
    x = torch.rand(5, 1, 8, 8)
    assert model(x).shape == (5, 10)
    error, engine = compare(model, cross_entropy, x, torch.randint(0, 10, (5,)))
    assert error < 1e-10
    assert set(engine.layer_methods.values()) <= {"ghost", "instantiate"}


def test_token_transformer_uses_embeddings_and_is_exact():
    torch.manual_seed(1)
    model = build_model("transformer", (6,), 3, dim=8, depth=1, heads=2, vocab_size=11)
    tokens = torch.randint(0, 11, (4, 6))
    error, engine = compare(model, cross_entropy, tokens, torch.randint(0, 3, (4,)))
    assert (
        error < 1e-10 and "tokens" in engine.layer_methods and "positions" in engine.layer_methods
    )


@pytest.mark.parametrize(
    "name,opts,match",
    [("resnet", {}, "train.model = 'resnet'"), ("mlp", {"depth": 3}, "model_options")],
)
def test_unknown_model_or_option_is_a_params_error(name, opts, match):
    with pytest.raises(ParamsError, match=match):
        build_model(name, (1, 8, 8), 10, **opts)
