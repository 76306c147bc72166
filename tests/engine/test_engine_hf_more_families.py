"""More `transformers` families no other test names (issue 35): a sequence-first encoder (XLNet
keeps its hidden states (T, B, d) inside, with relative attention), pooling and convolution inside
the encoder (Funnel, ConvBERT, SqueezeBERT's grouped 1-D convolutions), relative position buckets
(MPNet), Longformer's global attention (sequence-first (globals, B, d) projections) and the
everyday BERT, RoBERTa, GPT-2, Llama and Gemma; at B ≠ T and at B = T. Tiny random
configs, float64, every dropout off, nothing downloaded; every trainable parameter exact against a
naive per-example loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.engine_checks import check_every_parameter

transformers = pytest.importorskip("transformers")
families = pytest.importorskip("test_engine_hf_families")

VOCAB, LABELS, T = families.VOCAB, families.LABELS, families.T
ENCODER = dict(
    vocab_size=VOCAB,
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=32,
)
DECODER = dict(ENCODER, num_key_value_heads=1)


def _no_dropout(config):
    """Every float ``*drop*`` setting of the config at 0 (names differ per family)."""
    for name, value in list(vars(config).items()):
        if "drop" in name.lower() and isinstance(value, float):
            setattr(config, name, 0.0)
    return config


def _build(cls: str, config: str, **values) -> nn.Module:
    settings = _no_dropout(getattr(transformers, config)(attn_implementation="eager", **values))
    return getattr(transformers, cls)(settings)


def _classifier(cls: str, config: str, **values) -> tuple[nn.Module, object]:
    return families._Logits(_build(cls, config, num_labels=LABELS, **values), "input_ids"), "class"


def _causal(cls: str, config: str, **values) -> tuple[nn.Module, object]:
    return families._LM(_build(cls, config, **values)), "lm"


MORE = {
    "xlnet": lambda: _classifier(
        "XLNetForSequenceClassification",
        "XLNetConfig",
        vocab_size=VOCAB,
        d_model=8,
        n_layer=1,
        n_head=2,
        d_inner=16,
    ),
    "funnel": lambda: _classifier(
        "FunnelForSequenceClassification",
        "FunnelConfig",
        vocab_size=VOCAB,
        d_model=8,
        n_head=2,
        d_head=4,
        d_inner=16,
        block_sizes=[1, 1],
        num_decoder_layers=1,
    ),
    "convbert": lambda: _classifier(
        "ConvBertForSequenceClassification", "ConvBertConfig", embedding_size=8, **ENCODER
    ),
    "squeezebert": lambda: _classifier(
        "SqueezeBertForSequenceClassification",
        "SqueezeBertConfig",
        embedding_size=8,
        q_groups=2,
        k_groups=2,
        v_groups=2,
        post_attention_groups=2,
        intermediate_groups=2,
        output_groups=2,
        **ENCODER,
    ),
    "mpnet": lambda: _classifier("MPNetForSequenceClassification", "MPNetConfig", **ENCODER),
    "bert": lambda: _classifier("BertForSequenceClassification", "BertConfig", **ENCODER),
    "roberta": lambda: _classifier("RobertaForSequenceClassification", "RobertaConfig", **ENCODER),
    "gpt2": lambda: _causal(
        "GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=8, n_layer=1, n_head=2
    ),
    "llama": lambda: _causal("LlamaForCausalLM", "LlamaConfig", **DECODER),
    "gemma": lambda: _causal("GemmaForCausalLM", "GemmaConfig", head_dim=4, **DECODER),
    # global attention on the first token: query_global and friends see sequence-first
    # (globals, B, d) rows, whose leading 1 the probes first expanded (the model then failed)
    "longformer": lambda: _classifier(
        "LongformerForSequenceClassification", "LongformerConfig", attention_window=[4], **ENCODER
    ),
}


def _data(kind: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, object]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, T), generator=generator)
    if kind == "lm":
        return ids, ids, families.lm_loss
    return ids, torch.randint(0, LABELS, (batch,), generator=generator), families.class_loss


@pytest.mark.parametrize("batch", [families.B, T])
@pytest.mark.parametrize("name", list(MORE))
def test_more_families_are_exact_at_b_other_than_t_and_at_b_equal_to_t(name, batch):
    torch.manual_seed(0)
    model, kind = MORE[name]()
    inputs, targets, loss_fn = _data(kind, batch, seed=len(name))
    engine = check_every_parameter(model, loss_fn, inputs, targets)
    assert set(engine.layer_methods.values()) & {"ghost", "instantiate"}
