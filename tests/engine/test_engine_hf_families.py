"""The BK engine on more `transformers` families (issue 26): tiny random configs built here, nothing
downloaded.

Beyond tests/engine/test_engine_hf_models.py: encoders (DistilBERT, ALBERT, ELECTRA, DeBERTa-v2 with
relative attention), decoder-only LMs with rotary (GPT-NeoX with parallel attention, Mistral, Qwen2,
Phi, GPT-J), ALiBi (BLOOM, Falcon), learned positions (OPT, whose MLP runs on tokens flattened to
rows), encoder-decoders (BART, Whisper), vision with relative position bias (BEiT with layer scale,
Swin with windowed attention) and audio (Wav2Vec2, with its weight_norm positional convolution).
Each in float64, eager attention, dropout off, against a naive per-example autograd loop: the whole
clipped sum to 1e-10 relative and every trainable parameter one by one (``check_every_parameter``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.engine_checks import check_every_parameter

transformers = pytest.importorskip("transformers")

VOCAB, B, T, LABELS = 40, 3, 6, 3
DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
)
ENCODER = dict(
    DECODER, max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)


class _Logits(nn.Module):
    """An HF model called with one keyword input; returns its logits."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, inputs):
        return self.model(**{self.key: inputs}).logits


class _Seq2Seq(nn.Module):
    """BART: the first T ids of each row are the encoder input, the last T the decoder input."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids[:, :-T], decoder_input_ids=ids[:, -T:]).logits


class _Speech2Text(_Seq2Seq):
    """Whisper: (B, mel bins, frames + T) features whose last T columns of bin 0 carry the decoder
    ids."""

    def forward(self, inputs):
        features, ids = inputs[..., :-T], inputs[:, 0, -T:].long()
        return self.model(input_features=features, decoder_input_ids=ids).logits


def lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").sum(1)


def seq2seq_loss(logits, ids):
    return lm_loss(logits, ids[:, -T:])


def class_loss(logits, labels):
    return F.cross_entropy(logits, labels, reduction="none")


def _config(name: str, **values):
    return getattr(transformers, name)(attn_implementation="eager", **values)


def _model(cls: str, config: str, **values) -> nn.Module:
    return getattr(transformers, cls)(_config(config, **values))


def _tokens(seed: int, length: int = T) -> torch.Tensor:
    return torch.randint(2, VOCAB, (B, length), generator=torch.Generator().manual_seed(seed))


def _labels(seed: int) -> torch.Tensor:
    return torch.randint(0, LABELS, (B,), generator=torch.Generator().manual_seed(seed))


def _causal(cls: str, config: str, seed: int, **values):
    model = _LM(_model(cls, config, **values))
    return model, lm_loss, _tokens(seed), _tokens(seed)


class _LM(_Logits):
    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, "input_ids")


def _classifier(cls: str, config: str, seed: int, inputs=None, key="input_ids", **values):
    model = _Logits(_model(cls, config, num_labels=LABELS, **values), key)
    return model, class_loss, _tokens(seed) if inputs is None else inputs, _labels(seed)


def _image(seed: int, size: int = 8) -> torch.Tensor:
    return torch.randn(B, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _whisper(seed: int):
    model = _model(
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        vocab_size=VOCAB,
        num_mel_bins=4,
        d_model=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        max_source_positions=4,
        max_target_positions=16,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=1,
        decoder_start_token_id=0,
    )
    ids = _tokens(seed)
    features = torch.randn(B, 4, 8, generator=torch.Generator().manual_seed(seed))
    inputs = torch.cat([features, ids[:, None, :].expand(B, 4, T).to(features.dtype)], dim=-1)
    return _Speech2Text(model), lm_loss, inputs, ids


ROTARY = dict(DECODER, num_key_value_heads=1, max_position_embeddings=32)
FAMILIES = {
    "distilbert": lambda: _classifier(
        "DistilBertForSequenceClassification",
        "DistilBertConfig",
        10,
        vocab_size=VOCAB,
        dim=8,
        hidden_dim=16,
        n_layers=2,
        n_heads=2,
        max_position_embeddings=16,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
    ),
    "albert": lambda: _classifier(
        "AlbertForSequenceClassification",
        "AlbertConfig",
        11,
        embedding_size=4,
        classifier_dropout_prob=0.0,
        **ENCODER,
    ),
    "electra": lambda: _classifier(
        "ElectraForSequenceClassification", "ElectraConfig", 12, embedding_size=4, **ENCODER
    ),
    "deberta-v2": lambda: _classifier(
        "DebertaV2ForSequenceClassification",
        "DebertaV2Config",
        13,
        relative_attention=True,
        position_buckets=4,
        max_relative_positions=8,
        pos_att_type=["p2c", "c2p"],
        pooler_dropout=0.0,
        pooler_hidden_size=8,
        **dict(ENCODER, num_hidden_layers=1),
    ),
    "gpt-neox": lambda: _causal(
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        14,
        use_parallel_residual=True,
        rotary_pct=0.5,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        max_position_embeddings=32,
        **DECODER,
    ),
    "bloom": lambda: _causal(
        "BloomForCausalLM",
        "BloomConfig",
        15,
        vocab_size=VOCAB,
        hidden_size=8,
        n_layer=2,
        n_head=2,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    ),
    "falcon": lambda: _causal(
        "FalconForCausalLM",
        "FalconConfig",
        16,
        vocab_size=VOCAB,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        alibi=True,
        parallel_attn=True,
        new_decoder_architecture=False,
        multi_query=True,
        bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    ),
    "mistral": lambda: _causal(
        "MistralForCausalLM", "MistralConfig", 17, sliding_window=4, **ROTARY
    ),
    "qwen2": lambda: _causal("Qwen2ForCausalLM", "Qwen2Config", 18, **ROTARY),
    "phi": lambda: _causal(
        "PhiForCausalLM",
        "PhiConfig",
        19,
        partial_rotary_factor=0.5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attention_dropout=0.0,
        **ROTARY,
    ),
    "opt": lambda: _causal(
        "OPTForCausalLM",
        "OPTConfig",
        20,
        vocab_size=VOCAB,
        hidden_size=8,
        ffn_dim=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        word_embed_proj_dim=8,
        max_position_embeddings=16,
        dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=1,
    ),
    "gptj": lambda: _causal(
        "GPTJForCausalLM",
        "GPTJConfig",
        21,
        vocab_size=VOCAB,
        n_embd=8,
        n_layer=2,
        n_head=2,
        rotary_dim=2,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    "bart": lambda: (
        _Seq2Seq(
            _model(
                "BartForConditionalGeneration",
                "BartConfig",
                vocab_size=VOCAB,
                d_model=8,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=16,
                decoder_ffn_dim=16,
                max_position_embeddings=16,
                dropout=0.0,
                attention_dropout=0.0,
                activation_dropout=0.0,
                pad_token_id=1,
            ),
        ),
        seq2seq_loss,
        _tokens(22, 2 * T),
        _tokens(22, 2 * T),
    ),
    "whisper": lambda: _whisper(26),
    "swin": lambda: _classifier(
        "SwinForImageClassification",
        "SwinConfig",
        23,
        inputs=_image(23, 16),
        key="pixel_values",
        image_size=16,
        patch_size=2,
        embed_dim=4,
        depths=[2],
        num_heads=[2],
        window_size=4,
        mlp_ratio=2.0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    ),
    "beit": lambda: _classifier(
        "BeitForImageClassification",
        "BeitConfig",
        24,
        inputs=_image(24),
        key="pixel_values",
        image_size=8,
        patch_size=4,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        use_relative_position_bias=True,
        layer_scale_init_value=0.1,
        use_mean_pooling=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    ),
    "wav2vec2": lambda: _classifier(
        "Wav2Vec2ForSequenceClassification",
        "Wav2Vec2Config",
        25,
        inputs=torch.randn(B, 64, generator=torch.Generator().manual_seed(25)),
        key="input_values",
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(4, 4),
        conv_stride=(4, 2),
        conv_kernel=(4, 2),
        feat_extract_norm="layer",
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        layerdrop=0.0,
        mask_time_prob=0.0,
        apply_spec_augment=False,
    ),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_hf_family_is_exact_for_every_parameter(name):
    torch.manual_seed(0)
    model, loss_fn, inputs, targets = FAMILIES[name]()
    engine = check_every_parameter(model, loss_fn, inputs, targets)
    assert set(engine.layer_methods.values()) & {"ghost", "instantiate"}
