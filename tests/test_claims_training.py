"""C17: a run that never learned is not a run that diverged; C20: a token count never taken from the config."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from claims.experiments.norm_placement import diverged, never_learned
from claims.probes import vision
from claims.probes.training import norm_placement

TASK = SimpleNamespace(trivial_loss=2.77)          # ln 16: the context-free predictor


@pytest.mark.parametrize("run, blew_up, stalled", [
    (dict(nonfinite=True, final_loss=None, init_loss=3.0), True, False),
    (dict(nonfinite=False, final_loss=3.5, init_loss=3.0), True, False),      # worse than at init
    (dict(nonfinite=False, final_loss=2.80, init_loss=3.0), False, True),     # at chance: never learned
    (dict(nonfinite=False, final_loss=1.2, init_loss=3.0), False, False),     # learned
])
def test_chance_level_is_not_divergence(run, blew_up, stalled):
    assert diverged(run, TASK) is blew_up and never_learned(run, TASK) is stalled


class _Ctx:
    def __init__(self, result: dict) -> None:
        self.result = result

    def experiment(self, name: str) -> dict:
        return self.result


def _cell(placement: str, diverged: list[bool], stalled: list[bool]) -> dict:
    return {"placement": placement, "diverged": diverged, "never_learned": stalled}


def test_divergence_gap_counts_only_real_divergence():
    """Post-norm runs that sit at chance move never_learned_gap, not divergence_gap."""
    grid = {"pre/a": _cell("pre", [False, False], [False, False]),
            "post/a": _cell("post", [False, False], [True, True])}
    ev = norm_placement(_Ctx({"grid": grid, "seeds": [0, 1]}))        # type: ignore[arg-type]
    assert ev.figures["divergence_gap"].value == 0.0
    assert ev.figures["never_learned_gap"].value == 1.0
    grid["post/a"] = _cell("post", [True, True], [False, False])
    assert norm_placement(_Ctx({"grid": grid, "seeds": [0, 1]})).figures["divergence_gap"].value == 1.0  # type: ignore[arg-type]
    assert set(ev.unavailable) == {"sensitivity_ratio", "last_grad_ratio_deep"}       # said why, not left out


def test_an_old_result_without_the_distinction_is_unavailable_not_guessed():
    grid = {"pre/a": {"placement": "pre", "diverged": [False]}, "post/a": {"placement": "post", "diverged": [True]}}
    ev = norm_placement(_Ctx({"grid": grid, "seeds": [0]}))            # type: ignore[arg-type]
    assert "divergence_gap" not in ev.figures and "--fresh" in ev.unavailable["divergence_gap"]


def test_vit_tokens_never_falls_back_to_the_config(monkeypatch):
    """C20: with a model whose encoder block never runs, the token count is unavailable, not n_tokens = 197."""
    real = vision.resolve

    def hookless(name, **over):
        spec = real(name, **over)
        class Skip(torch.nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.inner = spec.build(cfg)
                self.blocks = [torch.nn.Identity()]              # a block the forward never calls
                self.patch_embed = self.inner.patch_embed

            def forward(self, x):
                return self.inner.patch_embed(x)
        return dataclasses.replace(spec, build=Skip)

    ev = vision.vit_tokens(None)                                        # type: ignore[arg-type]
    assert ev.figures["tokens_224_16"].value == 197 and ev.figures["patch_dim"].value == 768
    monkeypatch.setattr(vision, "resolve", hookless)
    ev = vision.vit_tokens(None)                                        # type: ignore[arg-type]
    assert "tokens_224_16" not in ev.figures and "never ran" in ev.unavailable["tokens_224_16"]
