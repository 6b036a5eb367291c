"""The one robust spread of the package, shared by the density model and the audits (numpy only:
the audits must import without scipy)."""

from __future__ import annotations

import numpy as np

#: the interquartile range of N(0, 1) in standard deviations: IQR / 1.349 estimates σ
IQR_PER_SD = 1.349
#: the constant of Silverman's rule of thumb as published (1986, eq. 3.31), rounded to 1.34: kept,
#: since the default model's candidate bandwidths (and so every assessment's numbers) start from it
SILVERMAN_IQR_PER_SD = 1.34


def robust_spread(x: np.ndarray, axis: int = 0, iqr_per_sd: float = IQR_PER_SD) -> np.ndarray:
    """min(sd, IQR / ``iqr_per_sd``) along ``axis``, the sd where the IQR is 0: the one robust
    spread of the package (bandwidth rules of the density model and of the audits)."""
    x = np.asarray(x, dtype=np.float64)
    sd = x.std(axis=axis, ddof=1) if x.shape[axis] > 1 else np.zeros(np.delete(x.shape, axis))
    q75, q25 = np.percentile(x, [75, 25], axis=axis)
    iqr = q75 - q25
    return np.where(iqr > 0, np.minimum(sd, iqr / iqr_per_sd), sd)
