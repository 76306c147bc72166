"""`transformers` families at a batch size equal to the sequence length (B = T), where a batch read
from a size would be taken from the wrong dimension: relative-position encoder-decoders (T5, UMT5,
LongT5 with local attention) at B = T and B ≠ T, and the relative-position, windowed and
encoder-decoder families of ``test_engine_hf_families.py`` again at B = T. Tiny random configs,
float64, nothing downloaded; every trainable parameter exact against a naive per-example loop.
Mixture-of-experts decoders (their router sees (B·T) rows) and Mamba (``dt_proj.bias`` used
outside its layer) are refused by name."""

from __future__ import annotations

import pytest
import test_engine_hf_families as families
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.engine import BKEngine, UnsupportedLayerError
from helpers.engine_checks import check_every_parameter

transformers = pytest.importorskip("transformers")

VOCAB, T = 40, 4


class _Seq2Seq(nn.Module):
    """The first T ids of each row are the encoder input, the last T the decoder input."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids[:, :T], decoder_input_ids=ids[:, T:]).logits


def _seq2seq_loss(logits, ids):
    return F.cross_entropy(logits.transpose(1, 2), ids[:, T:], reduction="none").mean(1)


def _lm_loss(logits, ids):
    return F.cross_entropy(logits.transpose(1, 2), ids, reduction="none").mean(1)


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _t5_like(cls: str, config: str, **extra) -> nn.Module:
    settings = dict(
        vocab_size=VOCAB,
        d_model=8,
        d_kv=4,
        d_ff=16,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        relative_attention_num_buckets=4,
        relative_attention_max_distance=8,
        dropout_rate=0.0,
        use_cache=False,
        decoder_start_token_id=0,
        attn_implementation="eager",
    )
    return getattr(transformers, cls)(getattr(transformers, config)(**settings, **extra))


RELATIVE = {
    "t5": lambda: _t5_like("T5ForConditionalGeneration", "T5Config"),
    "umt5": lambda: _t5_like("UMT5ForConditionalGeneration", "UMT5Config"),
    "longt5-local": lambda: _t5_like(
        "LongT5ForConditionalGeneration",
        "LongT5Config",
        local_radius=2,
        encoder_attention_type="local",
    ),
}


@pytest.mark.parametrize("batch", [T, 3])
@pytest.mark.parametrize("name", list(RELATIVE))
def test_relative_position_encoder_decoders_are_exact_at_and_off_the_sequence_length(name, batch):
    torch.manual_seed(0)
    ids = _tokens(batch, 2 * T, seed=batch)
    engine = check_every_parameter(_Seq2Seq(RELATIVE[name]()), _seq2seq_loss, ids, ids)
    assert "generic" in engine.layer_methods.values()  # the attention claims its bias table


AGAIN_AT_B_EQUALS_T = {
    "deberta-v2": families.T,
    "bart": families.T,
    "opt": families.T,  # its MLP runs on (B·T) rows
    "falcon": families.T,
    "beit": 5,  # 4 patches and the class token
    "swin": 4,  # 4 windows: the attention sees B·4 rows
}
"""Each family's batch size: its sequence length (text) or token count (images)."""


@pytest.mark.parametrize("name", list(AGAIN_AT_B_EQUALS_T))
def test_families_are_exact_when_the_batch_equals_the_sequence_length(name, monkeypatch):
    monkeypatch.setattr(families, "B", AGAIN_AT_B_EQUALS_T[name])
    torch.manual_seed(0)
    model, loss_fn, inputs, targets = families.FAMILIES[name]()
    assert inputs.shape[0] == AGAIN_AT_B_EQUALS_T[name]
    check_every_parameter(model, loss_fn, inputs, targets)


def _decoder(cls: str, config: str, **extra) -> nn.Module:
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = getattr(transformers, cls)(getattr(transformers, config)(**settings, **extra))
    return families._LM(model)


REFUSED = {
    "mixtral": (
        lambda: _decoder("MixtralForCausalLM", "MixtralConfig", num_local_experts=3),
        r"mlp\.gate \(MixtralTopKRouter\) sees 4 rows per example",
    ),
    "olmoe": (
        lambda: _decoder("OlmoeForCausalLM", "OlmoeConfig", num_experts=3, num_experts_per_tok=2),
        r"mlp\.gate \(OlmoeTopKRouter\) sees 4 rows per example",
    ),
    "mamba": (
        lambda: families._LM(
            transformers.MambaForCausalLM(
                transformers.MambaConfig(
                    vocab_size=VOCAB,
                    hidden_size=8,
                    state_size=4,
                    num_hidden_layers=1,
                    expand=2,
                    conv_kernel=3,
                    use_mambapy=True,
                )
            )
        ),
        r"dt_proj\.bias is used outside the forward of its layer",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_mixture_of_experts_and_state_space_models_are_refused_by_name(name):
    torch.manual_seed(0)
    build, match = REFUSED[name]
    model = build()
    engine = BKEngine(model, None, clip_norm=1.0, noise_multiplier=0.0, normalizer=1.0)
    ids = _tokens(T, T, seed=7)
    with pytest.raises(UnsupportedLayerError, match=match):
        engine.backward(_lm_loss(model(ids), ids))
