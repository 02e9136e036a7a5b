"""Ours against Hugging Face transformers, weight for weight: GPT-2 small, BERT-base and LLaMA (GQA, RoPE, SwiGLU,
RMSNorm). Parameters equal exactly at the released sizes (counted on the meta device); counted MACs within 0.5 %
at those sizes (fake tensors); with the transformers model's weights loaded into ours
(:mod:`architectures.hf_weights`), fp32 logits within 1e-5 relative and the same 32 greedy tokens through the
project's generation loop — on small configs of the same architectures (the full sizes only make it slower)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

from architectures import hf_models  # noqa: E402
from architectures.hf_weights import load_hf_weights, ours_config  # noqa: E402
from architectures.transformer import DECODERS, Decoder, Encoder  # noqa: E402
from harness.contract.registry import resolve  # noqa: E402
from harness.contract.spec import Workload  # noqa: E402
from harness.engine.generation import Generation  # noqa: E402
from harness.engine.models import fake_case  # noqa: E402
from harness.instruments.flops import count_model, count_params  # noqa: E402

LLAMA2_7B = dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008, max_seq_len=4096)
MISTRAL_7B = dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                  max_seq_len=131072, window=4095)
# (ours: preset + overrides, theirs: hf name + fields, the released count)
FULL = {
    "gpt2": (("gpt2-small", {}), ("hf:gpt2", {}), 124_439_808),
    "bert": (("bert-base", {}), ("hf:bert", {"head": "sequence-classification"}), 109_482_240 + 768 * 2 + 2),
    "llama-2-7b": (("decoder-llama-small", {**LLAMA2_7B, "n_kv_heads": None}), ("hf:llama-2-7b", {}), 6_738_415_616),
    "mistral-7b": (("decoder-llama-small", MISTRAL_7B), ("hf:mistral-7b-v0.1", {}), 7_241_732_096),
}
# Small configs of the same architectures (theirs; ours follows through ours_config).
SMALL = {
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)),
    "bert": ("bert", dict(head="sequence-classification", hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=128, vocab_size=512, max_position_embeddings=128,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)),
    "llama": ("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=176, vocab_size=512, rms_norm_eps=1e-5, initializer_range=0.2)),
}


def _meta_params(arch: str, over: dict) -> int:
    spec = resolve(arch, **over)
    with torch.device("meta"):
        return count_params(spec.build(spec.config))


@pytest.mark.parametrize("name", list(FULL))
def test_parameters_equal_at_released_sizes(name):
    """Ours and transformers' of the same released shape hold the same number of parameters, exactly."""
    (ours, ours_over), (theirs, theirs_over), released = FULL[name]
    assert _meta_params(ours, ours_over) == _meta_params(theirs, theirs_over) == released


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_ours_config_counts_theirs(name):
    """:func:`ours_config` of a transformers default config builds a model of theirs' parameter count."""
    model_type, _ = SMALL[name]
    head = "sequence-classification" if name == "bert" else "auto"
    theirs = hf_models.config_class(model_type)(head=head)
    ours = ours_config(theirs.hf_config())
    with torch.device("meta"):
        n_ours = count_params((Encoder if name == "bert" else Decoder)(ours))
        n_theirs = count_params(hf_models.HFModel(theirs))
    assert n_ours == n_theirs


def _macs(arch: str, over: dict, w: Workload) -> int:
    spec = resolve(arch, **over)
    model, inputs, mode = fake_case(spec, w, torch.device("cpu"))
    model.eval()
    with mode:
        return count_model(model, inputs).macs


@pytest.mark.parametrize("name", list(FULL))
def test_counted_macs_agree(name):
    """The same counter on both models at the released sizes, B=2 × T=128, on fake tensors: equal exactly (the
    issue allows 0.5 %). Every matmul is the same: our fused qkv and gate|up linears do the work of their separate
    projections; both RoPEs make their angles elementwise (transformers 5.x: positions[..., None] * inv_freq);
    causal attention is counted over the full score matrix on both sides (the counter's convention)."""
    (ours, ours_over), (theirs, theirs_over), _ = FULL[name]
    w = Workload(batch_size=2, seq_len=128)
    m_ours, m_theirs = _macs(ours, ours_over, w), _macs(theirs, theirs_over, w)
    assert m_ours > 0
    assert m_ours == m_theirs


def _pair(name: str) -> tuple[torch.nn.Module, hf_models.HFModel]:
    """A small transformers model of ``name`` (its init, seeded) and ours with its weights, both in eval."""
    model_type, fields = SMALL[name]
    torch.manual_seed(0)
    theirs = hf_models.HFModel(hf_models.config_class(model_type)(**fields)).eval()
    cfg = ours_config(theirs.model.config)
    ours = (Encoder if name == "bert" else Decoder)(cfg).eval()
    return load_hf_weights(ours, theirs.model, model_type), theirs


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("name", list(SMALL))
def test_logits_agree_with_their_weights(name):
    """fp32 logits of ours and theirs, same weights, B=2 × T=48 random tokens: within 1e-5 of theirs' largest."""
    ours, theirs = _pair(name)
    tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ours(tokens), theirs(tokens)
    assert a.shape == b.shape
    assert _relative(a, b) <= 1e-5


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_agrees(name):
    """32 greedy tokens after a 16-token prompt, through the project's generation loop (prefill + decode with
    each model's static cache: ours and transformers' StaticCache): the same tokens."""
    ours, theirs = _pair(name)
    prompt = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    runs = [Generation(m, prompt, 32) for m in (ours, theirs)]
    for run in runs:
        run()
    assert runs[0].tokens.shape == (2, 32)
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    # and both equal a plain full-sequence argmax loop of theirs (no cache), so neither cache is wrong alike
    seq = prompt
    with torch.no_grad():
        for _ in range(32):
            seq = torch.cat([seq, theirs(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(seq[:, 16:], runs[1].tokens)


def test_gpt2_needs_the_tanh_gelu():
    """Where ours and theirs disagreed: GPT-2's MLP uses GELU's tanh approximation ("gelu_new"); our gpt2-small
    used the exact GELU. With the exact one the logits differ far past fp32 rounding."""
    ours, theirs = _pair("gpt2")
    exact = Decoder(dataclasses.replace(ours.cfg, activation="gelu")).eval()
    exact.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert _relative(exact(tokens), theirs(tokens)) > 1e-4
    assert DECODERS["gpt2-small"].activation == "gelu_tanh"
