"""The ``hf:`` namespace: transformers models built from their config classes, run in every mode with the network
blocked; presets that are released shapes (counted); bad names and shapes refused in one line, nothing stored."""
from __future__ import annotations

import socket
import sys

import pytest
import torch

pytest.importorskip("transformers")

from architectures import hf_models  # noqa: E402
from harness.contract.errors import BenchInputError  # noqa: E402
from harness.contract.registry import namespace_presets, resolve  # noqa: E402
from harness.instruments.flops import count_params  # noqa: E402
from harness.store.db import Store  # noqa: E402
from tests.helpers import invoke, run_tiny  # noqa: E402

TINY_LLAMA = ('arch = "hf:llama", hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, '
              'num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 128')
TINY_GPT2 = 'arch = "hf:gpt2", n_embd = 32, n_layer = 2, n_head = 4, vocab_size = 128, n_positions = 64'
MODES_SUITE = f"""
name = "hf_modes"
metrics = ["latency", "memory", "flops"]
fixed = {{ batch_size = 2, threads = 1 }}
[lines]
"llama fwd"        = {{ {TINY_LLAMA}, seq_len = 16 }}
"llama fwd_bwd"    = {{ {TINY_LLAMA}, seq_len = 16, mode = "fwd_bwd" }}
"llama train_step" = {{ {TINY_LLAMA}, seq_len = 16, mode = "train_step" }}
"llama generate"   = {{ {TINY_LLAMA}, mode = "generate", prompt_len = 8, new_tokens = 4 }}
"llama compiled"   = {{ {TINY_LLAMA}, mode = "generate", prompt_len = 8, new_tokens = 4, compile = "default" }}
"gpt2 train_step"  = {{ {TINY_GPT2}, seq_len = 16, mode = "train_step" }}
"gpt2 generate"    = {{ {TINY_GPT2}, mode = "generate", prompt_len = 8, new_tokens = 4 }}
"bert fwd"         = {{ arch = "hf:bert", hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 4, \
intermediate_size = 64, vocab_size = 128, seq_len = 16 }}
"""


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection is recorded and refused."""
    attempts: list[object] = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"network blocked by the test: {address}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@pytest.mark.parametrize("name", list(hf_models.PRESETS))
def test_presets_are_the_released_shapes(name, no_network):
    """Each preset's default config builds exactly the released parameter count (on the meta device)."""
    spec = resolve(f"hf:{name}")
    with torch.device("meta"):
        assert count_params(spec.build(spec.config)) == hf_models.PRESETS[name].params
    assert not no_network


def test_listing_names_the_presets():
    result = invoke("list", "archs", "hf:*")
    assert result.exit_code == 0
    for name, preset in hf_models.PRESETS.items():
        line = next(line for line in result.stdout.splitlines() if line.startswith(f"hf:{name} "))
        assert preset.released in line and f"{preset.params:,}" in line
    assert list(namespace_presets("hf:*")) == sorted(f"hf:{n}" for n in hf_models.PRESETS)
    for name in hf_models.PRESETS:                  # the listing's words are the resolved spec's
        assert namespace_presets(f"hf:{name}")[f"hf:{name}"] == resolve(f"hf:{name}").description


def test_every_mode_runs_with_the_network_blocked(tmp_path, no_network):
    """fwd, fwd_bwd, train_step and generation (eager and compiled) of transformers models, counted and measured
    like any model, with every socket connection refused."""
    _, url, result = run_tiny(tmp_path, "--no-calibrate", "--no-report", text=MODES_SUITE)
    assert result.exit_code == 0, result.stderr
    store = Store(url, create=False)
    records = store.records(store.get_run("latest").id)
    assert {r.line: r.status for r in records} == {line: "ok" for line in (
        "llama fwd", "llama fwd_bwd", "llama train_step", "llama generate", "llama compiled", "gpt2 train_step",
        "gpt2 generate", "bert fwd")}
    for r in records:
        assert r.metrics["macs"] > 0 and r.metrics["peak_bytes"] > 0, r.line
    generated = [r for r in records if "generate" in r.line or "compiled" in r.line]
    assert all(r.metrics["tpot_ms"] > 0 and r.metrics["kv_cache_bytes"] > 0 for r in generated)
    assert not no_network


BAD = {
    "a Hub name": ('arch = "hf:meta-llama/Llama-2-7b"', "give its shape instead"),
    "an unknown model type": ('arch = "hf:lama"', "transformers has no model type 'lama'; did you mean llama"),
    "a field the class lacks": ('arch = "hf:gpt2", hidden_size = 64', "hf:gpt2 has no config field 'hidden_size'"),
    "a shape the config refuses": ('arch = "hf:llama", hidden_size = 100, num_attention_heads = 7',
                                   "not a multiple of the number of attention heads"),
    "k/v heads that do not divide": ('arch = "hf:llama", num_key_value_heads = 5', "must divide"),
    "a generation of an encoder": ('arch = "hf:bert", mode = "generate", prompt_len = 4, new_tokens = 2',
                                   "cannot generate"),
    "a generation past the learned positions": (
        'arch = "hf:gpt2", n_layer = 1, n_positions = 64, mode = "generate", prompt_len = 60, new_tokens = 10',
        "exceeds hf:gpt2's max_seq_len 64"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_stored(tmp_path, what, no_network):
    line, says = BAD[what]
    seq = "" if "generate" in line else ", seq_len = 8"
    suite = f'name = "bad"\nmetrics = ["latency"]\n[lines]\none = {{ {line}{seq} }}\n'
    _, url, result = run_tiny(tmp_path, text=suite)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "results.sqlite").exists() or not Store(url, create=False).list_runs()
    assert not no_network


def test_resolving_a_hub_name_never_imports_a_download():
    with pytest.raises(BenchInputError, match=r"bench never downloads: give its shape instead.*hf:llama"):
        resolve("hf:meta-llama/Llama-2-7b")


def test_fields_follow_the_config_class():
    """Fields set are passed, the others keep the class's defaults, and derived ones follow (head_dim)."""
    spec = resolve("hf:llama", hidden_size=256, num_attention_heads=4, num_hidden_layers=1)
    config = spec.config.hf_config()
    assert (config.hidden_size, config.head_dim, config.intermediate_size) == (256, 64, 11008)
    assert spec.config.changed() == {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 1}
    assert spec.config.built_head() == "causal-lm"
    assert resolve("hf:bert").config.built_head() == "base"          # BERT is no decoder
    assert resolve("hf:t5").config.built_head() == "seq2seq-lm"
    assert hf_models.learned_positions(resolve("hf:gpt2", n_layer=1).config) == 1024
    assert hf_models.learned_positions(resolve("hf:llama", num_hidden_layers=1).config) is None


def test_without_transformers_a_name_is_one_line_and_the_listing_still_works(monkeypatch):
    """The extra is optional: without it an hf: name says how to install it, and listing imports nothing."""
    monkeypatch.setitem(sys.modules, "transformers", None)           # `import transformers` raises ImportError
    with pytest.raises(BenchInputError, match=r"transformers is not installed: pip install .*\[hf\]"):
        resolve("hf:llama")
    result = invoke("list", "archs", "hf:*")
    assert result.exit_code == 0 and "hf:llama-2-7b" in result.stdout
