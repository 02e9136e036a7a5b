"""Claims decided by small training runs: the experiments in
claims/experiments, each returning per-seed lists that become means with 95% intervals."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from claims.evidence import Context
from claims.model import Chart, Evidence, Figure, mean_ci
from claims.power import clopper_pearson, detectable_gap, diff_resolution, paired_gap
from claims.probes import mean_chart, probe
from harness.analysis.fits import fit_line


def _note(res: dict[str, Any]) -> str:
    wall = res.get("wall_s")                          # set by Context.experiment
    return (res.get("data_description", "") + (f" (trained in {wall:,.0f} s)" if wall else "")).strip()


def per_seed(a: list, b: list, fn=lambda x, y: x - y) -> list[float]:
    """Per seed, ``fn(a, b)`` of the seeds where both runs finished (a diverged run, None, is left out)."""
    return [fn(x, y) for x, y in zip(a, b) if x is not None and y is not None]


FAIL_SKILL = 0.5      # the ViT "fails" when it gains less than half of the CNN's accuracy over chance
GOOD_SKILL = 0.8      # a model is "good" when it gains at least 80 % of the CNN's accuracy over chance


def skill_ratio(model: list, cnn: list, chance: float) -> list[float]:
    """Per seed, (accuracy − chance) / (CNN accuracy − chance): the share of the CNN's gain over chance.
    A seed whose CNN is at or below chance has no gain to share: the ratio is undefined, an error."""
    if any(c is None or c <= chance for c in cnn):
        raise ValueError(f"a CNN run is at or below chance ({chance:.2f}): the ViT's share of its gain is undefined")
    return [(m - chance) / (c - chance) for m, c in zip(model, cnn)]


def gap_fit(gaps: dict[str, list[float]]) -> tuple[Figure, Figure]:
    """Per seed, a least-squares line of the gap (CNN − ViT accuracy) against log10(training images):
    (its slope per decade, mean with a t-interval over seeds; the image count where the line reaches 0,
    10^(mean of per-seed log10 counts) with a t-interval — unbounded above when a seed's gap does not shrink)."""
    sizes = sorted(gaps, key=float)
    xs = np.log10([float(n) for n in sizes])
    slopes, roots, never = [], [], 0
    for i in range(min(len(gaps[n]) for n in sizes)):
        line = fit_line(xs, [gaps[n][i] for n in sizes])
        if line is None:
            raise ValueError(f"one training size ({sizes[0]}): the gap has no slope")
        b, a = line.slope, line.intercept
        slopes.append(float(b))
        if b < 0:
            roots.append(float(-a / b))
        else:
            never += 1
    what = f"gap vs log10(images) over {sizes[0]}…{sizes[-1]}, per seed"
    slope = mean_ci(slopes, "accuracy (fraction of test images) per 10× images", f"slope of the {what}")
    if not roots:
        return slope, Figure(math.inf, note=f"the gap does not shrink in any seed ({what})", unit="images")
    r = mean_ci(roots)
    hi = math.inf if never or r.hi is None else 10 ** r.hi
    lo = 10 ** r.lo if r.lo is not None else None
    if never and lo is None:
        lo = 10 ** r.value
    close = Figure(10 ** r.value, lo, hi, "images", f"where the fitted {what} reaches 0 (extrapolated)"
                   + (f"; in {never} seed(s) it does not shrink: unbounded" if never else ""), len(slopes))
    return slope, close


N_BOOT = 4000


def seed_bootstrap(acc: dict[str, list[float]], stat, n_test: int, n_boot: int = N_BOOT, seed: int = 0
                   ) -> tuple[float, float, float]:
    """(point, lo, hi): ``stat`` of the per-seed accuracies (models → aligned lists over seeds) and its 95%
    percentile interval from a two-level bootstrap: resample the seeds with replacement (the training run's
    variation), then each resampled seed's test accuracy as Binomial(n_test, acc)/n_test per model (the finite
    test set's). ``stat`` maps {model: array over seeds} to one number."""
    arrays = {m: np.asarray(v, dtype=float) for m, v in acc.items()}
    s = min(len(a) for a in arrays.values())
    arrays = {m: a[:s] for m, a in arrays.items()}
    point = float(stat(arrays))
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    for i in range(n_boot):
        idx = rng.integers(0, s, s)
        reps[i] = stat({m: rng.binomial(n_test, a[idx]) / n_test for m, a in arrays.items()})
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return point, float(lo), float(hi)


def boot_figure(acc: dict[str, list[float]], stat, n_test: int, unit: str, note: str) -> Figure:
    """:func:`seed_bootstrap` as a figure (n = the seeds)."""
    point, lo, hi = seed_bootstrap(acc, stat, n_test)
    n = min(len(v) for v in acc.values())
    return Figure(point, lo, hi, unit, f"{note}; 95% interval: bootstrap over {n} seeds and the {n_test} test "
                                       f"images ({N_BOOT} resamples)", n)


def skill(model: str, chance: float):
    """The statistic (model − chance) / (CNN − chance), mean over seeds (a CNN at chance has no gain: its
    denominator is floored, and the observed figure refuses it: :func:`skill_ratio`)."""
    return lambda a: float(np.mean((a[model] - chance) / np.maximum(a["cnn"] - chance, 1e-9)))


C24_FIGURES = ("gap_smallest", "cnn_acc_smallest", "vit_skill_smallest", "vit_skill_largest", "swin_skill_smallest",
               "vit_pretrained_skill_smallest", "gap_slope", "gap_closes_at", "gap_shrinks", "imagenet_scale")
C24_POWER = tuple(f"power_{k}" for k in ("gap_smallest", "cnn_acc_smallest", "vit_skill_smallest",
                                         "vit_skill_largest", "swin_skill_smallest"))


@probe("small_data", figures=C24_FIGURES + C24_POWER, reads=("experiment small_vision",))
def small_data(ctx: Context) -> Evidence:
    """C24 on the digits (the data set with a Swin): CNN, ViT and Swin of matched MACs per subset size, each part
    of the document's statement a figure: CNN − ViT and the CNN's accuracy at the smallest subset, the ViT's
    share of the CNN's gain over chance (it "fails" below FAIL_SKILL) at the smallest and the largest subset,
    Swin's share ("good" from GOOD_SKILL) — intervals from a bootstrap over seeds and test images; the gap
    fitted against log(images). A pretrained ViT and the huge-data side are not measured here (quoted)."""
    res = ctx.experiment("small_vision")
    ev = Evidence(notes=[_note(res)])
    datasets = res.get("datasets", {})
    series: dict[str, dict[str, list[float]]] = {}
    for name, d in datasets.items():
        for model, by_n in d.get("acc", {}).items():
            series[f"{name}: {model}"] = by_n
    primary = "digits" if "digits" in datasets else next(iter(datasets), None)
    if primary is None:
        raise ValueError("the small_vision experiment returned no data set")
    d = datasets[primary]
    sizes = sorted(d["subsets"])
    small, large = str(sizes[0]), str(sizes[-1])
    chance, acc = d["chance"], d["acc"]
    n_test = int(d.get("test_size") or d.get("scale", {}).get("test_size") or 0)
    if n_test <= 0:
        raise ValueError(f"the small_vision result gives no test-set size for {primary}")
    at = lambda n, *models: {m: acc[m][n] for m in models}  # noqa: E731
    ev.figures["gap_smallest"] = boot_figure(at(small, "cnn", "vit"), lambda a: float(np.mean(a["cnn"] - a["vit"])),
                                             n_test, "accuracy (fraction of test images)", f"{primary}: CNN − ViT at {small} images")
    ev.figures["cnn_acc_smallest"] = boot_figure(at(small, "cnn"), lambda a: float(np.mean(a["cnn"])), n_test,
                                                 "accuracy", f"{primary}, {small} images (chance {chance:.2f})")
    for size, key in ((small, "vit_skill_smallest"), (large, "vit_skill_largest")):
        skill_ratio(acc["vit"][size], acc["cnn"][size], chance)          # refuses a CNN at chance
        ev.figures[key] = boot_figure(at(size, "cnn", "vit"), skill("vit", chance), n_test, "of the CNN's gain",
                                      f"{primary}, {size} images: (ViT − chance) / (CNN − chance), chance {chance:.2f}")
    if small in acc.get("swin", {}):
        skill_ratio(acc["swin"][small], acc["cnn"][small], chance)
        ev.figures["swin_skill_smallest"] = boot_figure(
            at(small, "cnn", "swin"), skill("swin", chance), n_test, "of the CNN's gain",
            f"{primary}, {small} images: (Swin − chance) / (CNN − chance)")
    else:
        ev.unavailable["swin_skill_smallest"] = f"the experiment trained no Swin on {primary} at {small} images"
    for key in C24_POWER:
        fig = ev.figures.get(key.removeprefix("power_"))
        if fig is not None:
            ev.figures[key] = diff_resolution(fig, f"the {key.removeprefix('power_')} rule")
    ev.figures["gap_shrinks"] = mean_ci(per_seed(d["gap"][small], d["gap"][large]), "accuracy (fraction)",
                                        f"gap at {small} − gap at {large} images")
    ev.figures["gap_slope"], ev.figures["gap_closes_at"] = gap_fit(d["gap"])
    for other, od in datasets.items():
        if other != primary:
            slope, close = gap_fit(od["gap"])
            ev.notes.append(f"{other}: CNN − ViT slope {slope.text()}, closes at {close.text()}")
    costs = d.get("scale", {}).get("models", {})
    if costs:
        ev.notes.append(f"{primary}: forward MACs per image " + ", ".join(f"{m} {c['macs']:,}" for m, c in costs.items()))
    ev.unavailable["vit_pretrained_skill_smallest"] = (
        "not measured: the table's 'ViT (pretrained)' column needs a ViT pretrained on a large set, which this "
        "CPU cannot train (the Swin is a from-scratch model, not that column)")
    ev.unavailable["imagenet_scale"] = ("quoted, not measured: Dosovitskiy et al. 2021 (ViT-B/16 from scratch on "
                                        "ImageNet-1k 77.9 % vs 84.2 % after JFT-300M); JFT/ImageNet-scale training "
                                        "is out of reach here (the largest set is 1,257 small images)")
    ev.chart = mean_chart(series, "test accuracy vs training images", "training images", "accuracy", x_log=True)
    return ev


@probe("scaling", figures=("var_ratio_unscaled", "var_scaled", "saturation_gap", "jacobian_ratio",
                           "train_loss_gap"), reads=("experiment attn_scaling",))
def scaling(ctx: Context) -> Evidence:
    """C07: the numeric part (variance, saturation, Jacobian at d_k) and the tiny training run."""
    res = ctx.experiment("attn_scaling")
    ev = Evidence(notes=[_note(res)])
    raw = res.get("numeric", {})
    dks = sorted((k for k in raw if k.isdigit()), key=int)
    stat = lambda k, key: mean_ci(raw[k][key]).value  # noqa: E731  (mean over seeds)
    if dks:
        big = max((k for k in dks if int(k) <= 256), key=int, default=dks[-1])
        ratios = [stat(k, "var_unscaled") / int(k) for k in dks]
        ev.figures["var_ratio_unscaled"] = Figure(sum(ratios) / len(ratios), min(ratios), max(ratios), "× d_k",
                                                  f"Var(q·k)/d_k unscaled; range over d_k = {', '.join(dks)}")
        scaled = [stat(k, "var_scaled") for k in dks]
        ev.figures["var_scaled"] = Figure(sum(scaled) / len(scaled), min(scaled), max(scaled), "",
                                          "Var(q·k/√d_k); range over d_k")
        ev.figures["saturation_gap"] = mean_ci(per_seed(raw[big]["saturated_unscaled"], raw[big]["saturated_scaled"]),
                                               "share of rows", f"d_k={big}: rows with max p > 0.99, "
                                               "unscaled − scaled")
        jac = per_seed(raw[big]["jacobian_median_unscaled"], raw[big]["jacobian_median_scaled"],
                        lambda a, b: a / b)
        ev.figures["jacobian_ratio"] = mean_ci(
            jac, "×", f"d_k={big}: median ‖∂softmax/∂logits‖_F per row, unscaled / scaled "
                      "(the mean is not monotone in saturation: a one-hot row has J = 0)")
        ev.chart = Chart("saturated softmax rows vs d_k", "d_k", "share of rows with max p > 0.99", {
            "unscaled": [(int(k), stat(k, "saturated_unscaled"), None, None) for k in dks],
            "scaled by 1/√d_k": [(int(k), stat(k, "saturated_scaled"), None, None) for k in dks]}, x_log=True)
    train = res.get("training", {})
    if train.get("unscaled", {}).get("final_loss") and train.get("scaled", {}).get("final_loss"):
        ev.figures["train_loss_gap"] = mean_ci(per_seed(train["unscaled"]["final_loss"],
                                                         train["scaled"]["final_loss"]), "nats",
                                               "held-out loss unscaled − scaled, per seed")
    return ev


NORM_FIGURES = ("failure_gap", "failure_gap_detectable", "failure_rate_post", "failure_rate_pre", "divergence_gap",
                "never_learned_gap", "sensitivity_ratio", "last_grad_ratio_deep")


def paired_flags(cells: dict[str, Any], flag: str) -> tuple[list[bool], list[bool], list[str]]:
    """(post's flags, pre's flags, the pairs' names): the same learning rate and run seed trained with each
    placement is one pair."""
    post, pre, names = [], [], []
    for cell in cells.values():
        if cell.get("placement") != "post":
            continue
        twin = next((c for c in cells.values() if c.get("placement") == "pre" and c.get("lr") == cell.get("lr")
                     and c.get("depth") == cell.get("depth") and c.get("warmup") == cell.get("warmup")), None)
        if twin is None or flag not in cell or flag not in twin:
            continue
        post += [bool(x) for x in cell[flag]]
        pre += [bool(x) for x in twin[flag]]
        names += [f"lr {cell.get('lr')} run {i}" for i in range(len(cell[flag]))]
    return post, pre, names


def norm_failures(res: dict[str, Any], ev: Evidence) -> None:
    """C17's central figures: post − pre failure rate over the paired runs (exact paired bootstrap), each
    placement's rate (exact binomial interval), and the smallest gap the grid could have detected (80 % power,
    at pre-norm's failure rate): the rule's ``power``."""
    cells = res.get("grid", {})
    post, pre, _ = paired_flags(cells, "failed")
    if not post:
        for key in ("failure_gap", "failure_gap_detectable", "failure_rate_post", "failure_rate_pre"):
            ev.unavailable[key] = ("the experiment's result has no paired failure flags (trained by older code: "
                                   "measure it again with --fresh)")
    else:
        n = len(post)
        lrs = sorted({c["lr"] for c in cells.values()})
        where = f"{n} pairs: lr {', '.join(f'{x:g}' for x in lrs)} × runs, no warm-up"
        ev.figures["failure_gap"] = paired_gap(post, pre, note=f"failure rate (diverged or never beat chance) post − "
                                                              f"pre over {where}; exact paired-bootstrap 95% interval")
        ev.figures["failure_rate_post"] = clopper_pearson(sum(post), n, note="post-norm runs that failed; exact "
                                                                            "binomial interval")
        ev.figures["failure_rate_pre"] = clopper_pearson(sum(pre), n, note="pre-norm runs that failed; exact "
                                                                          "binomial interval")
        base = sum(pre) / n
        mde = detectable_gap(n, base)
        if math.isfinite(mde):
            ev.figures["failure_gap_detectable"] = Figure(mde, unit="share of runs", n=n, note=(
                f"the smallest post − pre gap found above 0 with 80% power by {n} pairs at pre-norm's "
                f"failure rate {base:.2g}"))
        else:
            ev.unavailable["failure_gap_detectable"] = (f"no power: {n} pairs at pre-norm's failure rate {base:.2g} "
                                                        "would not detect even the largest possible gap")
        by_lr = ", ".join(f"lr {c['lr']:g}: {c['placement']} {sum(c['failed'])}/{len(c['failed'])}"
                          for c in sorted(cells.values(), key=lambda c: (c["lr"], c["placement"])))
        ev.notes.append(f"failed runs per learning rate: {by_lr}")
    for key, flag, what in (("divergence_gap", "diverged", "non-finite or loss above its start"),
                            ("never_learned_gap", "never_learned", "stayed finite but never beat chance (ln 16)")):
        a, b, _ = paired_flags(cells, flag)
        if a and paired_flags(cells, "never_learned")[0]:     # an old result did not tell the two apart
            ev.figures[key] = paired_gap(a, b, note=f"runs that {what}, post − pre over {len(a)} pairs")
        else:
            ev.unavailable[key] = ("the experiment's result does not tell divergence from never learning "
                                   "(measure it again: --fresh)")


@probe("norm_placement", figures=NORM_FIGURES, reads=("experiment norm_placement",))
def norm_placement(ctx: Context) -> Evidence:
    res = ctx.experiment("norm_placement")
    ev = Evidence(notes=[_note(res)])
    norm_failures(res, ev)
    spread = res.get("summary", {}).get("lr_spread", {})
    if spread.get("pre") and spread.get("post"):
        ev.figures["sensitivity_ratio"] = mean_ci(per_seed(spread["post"], spread["pre"], lambda a, b: a / b
                                                            if b else float("nan")), "×",
                                                  "spread of final loss across learning rates, post / pre, per run")
    else:
        ev.unavailable["sensitivity_ratio"] = "the experiment recorded no learning-rate spread"
    grads = res.get("grad_norm_at_init", {})
    if grads:
        deep = max(grads, key=float)
        g = grads[deep]
        ev.figures["last_grad_ratio_deep"] = mean_ci(per_seed(g["post"]["last_layer"], g["pre"]["last_layer"],
                                                               lambda a, b: a / b), "×",
                                                     f"last layer's gradient norm at init, post / pre, depth {deep}")
        ev.chart = mean_chart({p: {d: grads[d][p]["last_layer"] for d in grads} for p in ("pre", "post")},
                              "last layer's gradient norm at initialisation", "depth", "‖∇‖ (mean over seeds)",
                              x_log=True, y_log=True)
    else:
        ev.unavailable["last_grad_ratio_deep"] = "the experiment recorded no gradient norms at initialisation"
    return ev


@probe("causal", figures=("masked_future_change", "unmasked_future_change", "train_loss_gap", "honest_loss_gap"),
       reads=("experiment causal",))
def causal(ctx: Context) -> Evidence:
    res = ctx.experiment("causal")
    ev = Evidence(notes=[_note(res)])
    m = res.get("models", {})
    c, n = m.get("causal", {}), m.get("no_mask", {})
    if c.get("future_change_max_abs"):
        ev.figures["masked_future_change"] = Figure(max(c["future_change_max_abs"]), unit="max |Δ|",
                                                    note="outputs before i when tokens after i change, masked")
    if n.get("future_change_max_abs"):
        ev.figures["unmasked_future_change"] = Figure(min(n["future_change_max_abs"]), unit="max |Δ|",
                                                      note="the same without the mask (smallest over seeds)")
    if c.get("train_loss") and n.get("train_loss"):
        ev.figures["train_loss_gap"] = mean_ci(per_seed(c["train_loss"], n["train_loss"]), "nats",
                                               "training loss masked − unmasked, per seed")
    if c.get("gen_loss_last_position") and n.get("gen_loss_last_position"):
        ev.figures["honest_loss_gap"] = mean_ci(per_seed(n["gen_loss_last_position"], c["gen_loss_last_position"]),
                                                "nats", "next-token loss with only the prefix visible, "
                                                "unmasked − masked")
        ev.chart = Chart("loss: training vs generation-time", "", "nats", {
            "masked: train": [("masked train", mean_ci(c["train_loss"]).value, None, None)],
            "unmasked: train": [("unmasked train", mean_ci(n["train_loss"]).value, None, None)],
            "masked: prefix only": [("masked prefix-only", mean_ci(c["gen_loss_last_position"]).value, None, None)],
            "unmasked: prefix only": [("unmasked prefix-only", mean_ci(n["gen_loss_last_position"]).value, None,
                                       None)]}, kind="bar")
    return ev


@probe("residual", figures=("loss_gap_plain_minus_residual", "residual_learns", "plain_learns",
                            "first_grad_ratio_residual_over_plain", "shallow_loss_gap"), reads=("experiment residual",))
def residual(ctx: Context) -> Evidence:
    """C43 from the ``residual`` experiment: deep stacks with and without their skip connections, same
    weights, same batches; held-out loss after training, the first block's gradient norm at initialisation,
    and a shallow control (where the skip should matter little)."""
    res = ctx.experiment("residual")
    ev = Evidence(notes=[res.get("data_description", "")])
    m = res["models"]
    deep, shallow, chance = str(res["deep"]), str(res["shallow"]), res["chance_loss"]
    r, p = m[deep]["residual"], m[deep]["plain"]
    ev.figures["loss_gap_plain_minus_residual"] = mean_ci(
        per_seed(p["final_loss"], r["final_loss"], lambda a, b: a - b), "nats",
        f"held-out loss after training, plain − residual, depth {deep}, per seed (a diverged run counts as missing)")
    ev.figures["residual_learns"] = mean_ci(
        [chance - x for x in r["final_loss"] if x is not None], "nats below chance",
        f"context-free chance ln(n_symbols) = {chance:.3f} minus the residual stack's final loss, depth {deep}")
    ev.figures["plain_learns"] = mean_ci(
        [chance - x for x in p["final_loss"] if x is not None], "nats below chance",
        f"chance minus the plain (no-skip) stack's final loss, depth {deep}")
    ev.figures["first_grad_ratio_residual_over_plain"] = mean_ci(
        per_seed(r["first_grad"], p["first_grad"], lambda a, b: math.log10(a / b)), "log10 ×",
        f"log10 of the first block's gradient norm at init, residual over plain, depth {deep}, per seed")
    rs, ps = m[shallow]["residual"], m[shallow]["plain"]
    ev.figures["shallow_loss_gap"] = mean_ci(
        per_seed(ps["final_loss"], rs["final_loss"], lambda a, b: a - b), "nats",
        f"the same gap at depth {shallow} (control)")
    ev.chart = Chart("Held-out loss after training, with and without residual connections", "depth (blocks)",
                     "held-out loss (nats)", {
                         name: [(int(d), *_mean3(m[d][name]["final_loss"])) for d in (shallow, deep)]
                         for name in ("residual", "plain")}, hlines={"chance": chance})
    return ev


def _mean3(xs: list) -> tuple[float, float | None, float | None]:
    f = mean_ci(xs)
    return f.value, f.lo, f.hi
