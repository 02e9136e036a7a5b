"""The instruments: timing, memory, FLOP/MAC counting, load, calibration, kernels, energy."""
