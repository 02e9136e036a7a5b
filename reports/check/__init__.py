"""A CI regression gate: a run checked against a stored baseline, one verdict per case (pure, torch-free).

One job a module: :mod:`~reports.check.baseline` (the baseline file, written and read back),
:mod:`~reports.check.timing` (the statistics of a timing verdict), :mod:`~reports.check.metrics` (which metrics
are compared exactly or within a tolerance), :mod:`~reports.check.report` (the check: a verdict per case) and
:mod:`~reports.check.render` (the headline, the terminal table, Markdown). Cases are named as every view names
them (:mod:`reports.labels`). Import from the module that does the job (``from reports.check.report import
check_run``); this docstring states the rules.

``bench baseline SUITE -o FILE.json`` stores a measured run as a baseline document (:func:`~reports.check.baseline.write_baseline`);
``bench check SUITE --baseline FILE.json`` measures again and :func:`~reports.check.report.check_run` gives every case a verdict.
Cases are aligned on ``case_key``.

**Timing.** A timing regresses when the candidate's median is slower by more than the larger of 5 % and three
times the between-round coefficient of variation, and a Mann–Whitney U test on the raw samples gives
p < 0.002 (asv uses ratio > 1.1 and p < 0.002). In full, with ``ratio = median(candidate) / median(baseline)``
and ``floor = max(MIN_EFFECT, NOISE_MULTIPLE · max(round CV of the baseline, round CV of the candidate))``
(:func:`~reports.check.timing.effect_floor`; the round CV is the standard deviation of the round medians over their mean,
:func:`harness.analysis.stats.round_summary`, the drift a rerun sees; a side timed in fewer than two rounds has none):

- ``regressed``: ratio > 1 + floor and p < ALPHA (two-sided Mann–Whitney U on the raw per-call samples);
- ``improved``: ratio < 1 / (1 + floor) and p < ALPHA;
- ``unchanged``: |log ratio| ≤ log(1 + floor), whatever p: a change too small to matter;
- ``inconclusive``: beyond the floor but not significant (the CLI re-measures these cases once); also a
  regression or improvement measured while other processes used more than half a core
  (``load_busy``, :mod:`harness.instruments.load`): a busy machine decides nothing.

**Over processes**: where both sides were measured in two or more worker processes
(``n_processes``; their rounds process by process, :func:`harness.analysis.process_stats.process_groups`), the ratio is
the geometric mean of the candidate's per-process medians over the baseline's, with a two-level bootstrap
interval (:func:`harness.analysis.process_stats.process_ratio`; per pair of processes with ``--against``:
:func:`harness.analysis.process_stats.paired_process_ratio`); ``regressed`` when ratio > 1 + MIN_EFFECT and the
``1 - ALPHA`` interval lies above 1 (``improved`` mirrored; within the floor ``unchanged``; else
``inconclusive``). Every verdict carries its minimum detectable effect (``mde``: the slowdown caught with 80 %
power given the spread between processes; with one process a side, the floor or the interval's reach),
printed in the verdict cell and summed up by :func:`~reports.check.render.power_line`.

**Over occasions**: a baseline file written on several occasions (``bench baseline --occasions K``, default 5, or
grown with ``--append``: per case ``occasion_medians_ms``, each occasion's per-process medians) is checked as a
prediction for one more occasion (:func:`harness.analysis.process_stats.occasion_ratio`): the standard error holds
the spread between the baseline's occasions, ``K - 1`` degrees of freedom, the same ``ALPHA``, floor and verdict
rule. A file baseline and its check run on two occasions, and a case's speed moves between occasions by more
than its processes differ within one (the 23 % A/A false alarm of a one-occasion baseline, README "CI"): only
the occasion level covers that. ``--against`` measures both versions on one occasion, interleaved, and stays
over (paired) processes. A one-occasion baseline (``--occasions 1``, or a file written before) is judged over
processes and the verdict says "1 occasion: drift between occasions not covered".

*Paired* timings (both sides measured in the same rounds, side by side, e.g. a re-measurement that interleaves
the baseline's code with the candidate's): the ratio is the paired ratio of :func:`harness.analysis.stats.paired_ratio`
(geometric mean of the per-round ratios of the round medians) and "significant" means its 95 % interval
excludes 1, in place of the Mann–Whitney p; the floor rule is the same. The ratio's interval shown is the
bootstrap interval of :func:`harness.analysis.stats.compare` for unpaired timings, the paired interval for paired ones.

**Deterministic metrics** (:data:`~reports.check.metrics.DETERMINISTIC`: ``macs``, ``flops``, ``params``, ``est_peak_bytes``,
``activation_peak_bytes``, ``peak_bytes`` and every ``analytic_*``) are compared *exactly* when the torch
version matches; any difference is ``changed``. On CUDA cases ``peak_bytes`` and ``activation_peak_bytes``
come from the caching allocator and get the relative tolerance :data:`~reports.check.metrics.CUDA_PEAK_TOLERANCE` instead.
**Tolerant metrics** (:data:`~reports.check.metrics.TOLERANT`: RSS and CUDA allocator peaks) are ``changed`` when they move by more
than their stated relative tolerance (RSS 50 %, CUDA allocator 10 %).

**Environment.** The hard fingerprint keys of the baseline and the candidate
(:func:`reports.compare.env_differences`) decide what is gated. Another torch version: deterministic
differences only warn. Any hard key differing (another machine or software stack): a warning; timing and
tolerant-metric verdicts are still computed and shown but marked "not gated", unless ``gate_timing=True``
forces timing gating. ``gate_timing=None`` (the default) gates timing only when the hard environments match;
``False`` never gates it.

**Case verdicts**, first that applies: ``missing`` (in the baseline, not in this run), ``new`` (only in this
run; never gated), ``failed`` (an error now — as `bench run` exits 1 on one — or ok in the baseline and not ok now),
``changed`` (a gated deterministic or tolerant
metric moved), then the gated timing verdict ``regressed`` / ``inconclusive`` / ``improved``, else ``ok``.
The check fails when any case is ``regressed``, ``changed``, ``failed`` or ``missing``.
"""
