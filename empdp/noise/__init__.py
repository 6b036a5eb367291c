"""Noise calibration and release (docs/method.md#8-calibration-and-release): exact λ*, deconvolution, secure sampling, ledger.

Modules, in data-flow order: :mod:`.exact` (ε_i(λ) and λ*), :mod:`.deconv`
(the noise h), :mod:`.compute` (calibrate: the steps from the data to the noise),
:mod:`.calibration` (the result: its file, its signature, its releases),
:mod:`.joint` (2–3 statistics released together),
:mod:`.sampler` (secure exact draws), :mod:`.ledger` (append-only record and
budget; :mod:`.ledger_format` is what its file holds, :mod:`.ledger_v1` reads the
first, unkeyed format).
"""

from .calibration import Calibration
from .compute import calibrate, calibrate_values
from .deconv import NoiseSpec, fourier_deconvolve, gaussian_fallback, laplace_closed_form
from .exact import hausdorff_distance, laplace_kde_eps, minimal_lambda, winf_distance
from .joint import (
    JointCalibration,
    calibrate_joint,
    calibrate_joint_values,
    load_calibration,
)
from .ledger import Ledger, LedgerError
from .sampler import NoiseSampler
from .source import SourceShifts, joint_query_value, query_value, release_value

__all__ = [
    "Calibration",
    "JointCalibration",
    "Ledger",
    "LedgerError",
    "NoiseSampler",
    "NoiseSpec",
    "SourceShifts",
    "calibrate",
    "calibrate_joint",
    "calibrate_joint_values",
    "calibrate_values",
    "fourier_deconvolve",
    "gaussian_fallback",
    "hausdorff_distance",
    "joint_query_value",
    "laplace_closed_form",
    "laplace_kde_eps",
    "load_calibration",
    "minimal_lambda",
    "query_value",
    "release_value",
    "winf_distance",
]
