"""`transformers` families at a batch size equal to the sequence length (B = T), where a batch read
from a size would be taken from the wrong dimension: relative-position encoder-decoders (T5, UMT5,
LongT5 with local attention) at B = T and B ≠ T, and the relative-position, windowed and
encoder-decoder families of ``test_engine_hf_families.py`` again at B = T. Tiny random configs,
float64, nothing downloaded; every trainable parameter exact against a naive per-example loop.
Mixture-of-experts decoders (their router sees (B·T) rows, their experts gather tokens per expert)
and state-space models (``conv1d`` and ``dt_proj`` weights passed to the mixer's kernels) are exact
at B = T and B ≠ T, each block or mixer one generic-rule layer."""

from __future__ import annotations

import pytest
import test_engine_hf_families as families
import torch
import torch.nn.functional as F
from torch import nn

from dpledger.models.tasks import Task
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


EAGER = {"experts_implementation": "eager"}  # transformers' default grouped_mm has no float64


def _mamba(cls: str, config: str, **extra) -> nn.Module:
    settings = dict(
        vocab_size=VOCAB, hidden_size=8, state_size=4, num_hidden_layers=1, expand=2, conv_kernel=3
    )
    return families._LM(
        getattr(transformers, cls)(getattr(transformers, config)(**settings, **extra))
    )


def _jamba_config(**extra):
    return transformers.JambaConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=3,
        num_experts_per_tok=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        attn_layer_period=2,
        attn_layer_offset=0,
        mamba_d_state=4,
        mamba_d_conv=3,
        mamba_expand=2,
        mamba_dt_rank=2,
        use_mamba_kernels=False,
        **EAGER,
        **extra,
    )


def _jamba() -> nn.Module:
    # its mixer writes into a cache passed in training: the train stage passes use_cache=False
    return families._LM(transformers.JambaForCausalLM(_jamba_config(use_cache=False)))


MIXTURES_AND_STATE_SPACES = {
    "mixtral": lambda: _decoder(
        "MixtralForCausalLM", "MixtralConfig", num_local_experts=3, **EAGER
    ),
    "olmoe": lambda: _decoder(
        "OlmoeForCausalLM", "OlmoeConfig", num_experts=3, num_experts_per_tok=2, **EAGER
    ),
    "qwen2_moe": lambda: _decoder(
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        num_experts=3,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,  # a shared expert and its gate beside the router
        **EAGER,
    ),
    "qwen3_moe": lambda: _decoder(
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        num_experts=3,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        **EAGER,
    ),
    "mamba": lambda: _mamba("MambaForCausalLM", "MambaConfig", use_mambapy=True),
    "mamba_sequential": lambda: _mamba("MambaForCausalLM", "MambaConfig"),
    "falcon_mamba": lambda: _mamba("FalconMambaForCausalLM", "FalconMambaConfig"),
    "mamba2": lambda: _mamba(
        "Mamba2ForCausalLM", "Mamba2Config", num_heads=4, head_dim=4, n_groups=1, chunk_size=4
    ),
    "jamba": _jamba,
}
"""Mixture-of-experts decoders (router on (B·T) rows, experts as 3-D parameters gathered per
expert; Qwen2-MoE with a shared expert) and state-space models (conv1d and dt_proj weights passed
to the mixer's kernels as plain tensors; Jamba mixes both with attention): refused by name before,
now each block or mixer is one generic-rule layer (``engine/layers/generic.py``)."""


@pytest.mark.parametrize("batch", [T, 3])
@pytest.mark.parametrize("name", list(MIXTURES_AND_STATE_SPACES))
def test_mixture_of_experts_and_state_space_models_are_exact(name, batch):
    torch.manual_seed(0)
    model = MIXTURES_AND_STATE_SPACES[name]()
    ids = _tokens(batch, T, seed=7)
    engine = check_every_parameter(model, _lm_loss, ids, ids)
    blocks = [
        n
        for n, method in engine.layer_methods.items()
        if n.endswith((".mlp", ".mixer", ".mamba", ".feed_forward"))
    ]
    assert blocks and all(engine.layer_methods[n] == "generic" for n in blocks)


class _TaskCalled(nn.Module):
    """The model called as the train stage calls it (``Task.logits``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return Task("causal-lm").logits(self.model, ids)


def test_jamba_with_its_default_cache_is_exact_as_the_train_stage_calls_it():
    """Jamba's config keeps a cache by default, which its mixer writes during training; the train
    stage's calling convention passes use_cache=False to a forward that names it."""
    torch.manual_seed(0)
    model = transformers.JambaForCausalLM(_jamba_config())
    assert model.config.use_cache
    ids = _tokens(3, T, seed=7)
    check_every_parameter(_TaskCalled(model), _lm_loss, ids, ids)
