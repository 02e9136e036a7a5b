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

**Timing.** Every timing verdict is the one comparison of :mod:`harness.analysis.comparison` (the same that
``bench compare``, the run headline and the claims print): the candidate over the baseline, at the highest level
both sides allow — the baseline's *occasions* (a file written by ``bench baseline --occasions K``, default 5, or
grown with ``--append``: a prediction for one more occasion, so the drift between the baseline's day and the
check's is in the interval), else *processes* (both sides measured in two worker processes or more; per pair of
processes with ``--against``, whose versions ran alternately), else *rounds*, else the samples of *one process*.
With ``ratio`` its candidate/baseline ratio and ``[lo, hi]`` its 95 % interval, and ``floor`` = 5 %
(:data:`~reports.check.timing.MIN_EFFECT`):

- ``unchanged`` (the case reads ``ok``): the whole interval lies within ``[1/(1+floor), 1+floor]`` — equivalence
  shown, not assumed;
- ``regressed``: ratio > 1 + floor and the ``1 - ALPHA`` interval lies above 1 (ALPHA = 0.002); ``improved``
  mirrored;
- ``inconclusive``: everything else; also a regression or improvement measured while other processes used more
  than half a core (``load_busy``, :mod:`harness.instruments.load`): a busy machine decides nothing.

Every verdict carries its smallest detectable slowdown (``mde``: the slowdown it calls ``regressed`` with 80 %
power), printed in the verdict cell and summed up by :func:`~reports.check.render.power_line`; the headline says
``unchanged within 5 %`` only when every gated timing is, else ``no regression seen (could see ≥ X %)`` with X
the largest MDE of an inconclusive case, or the regressions. ``bench check`` adds processes to the cases whose MDE
is above ``--target-mde`` until it is met or ``--budget`` is spent (:mod:`~reports.check.adaptive`), and
``--max-mde`` fails a check that could not see a slowdown of that size (exit status 3).

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
