"""Per-individual risk (docs/method.md#4-risk): δ_i(ε), ε_i, screening bounds.

Modules: :mod:`.bounds` (screening bounds, τ), :mod:`.exact` (:func:`evaluate`: which path), :mod:`.blocks` (one block, in a worker process too), :mod:`.onescale` (the default model, in closed form), and the general path: :mod:`.grid` (nodes), :mod:`.laplace` and :mod:`.gaussian` (densities on them), :mod:`.cells` (certified bounds within cells), :mod:`.nodes` (extrema, ε_i, the sweep) and :mod:`.cuts` (partial integrals).

The general path:

For a chunk of individuals (rows of a dense shift matrix D) we evaluate, on
nodes that contain every kink of both densities, p̂ and p̂_i with their
one-sided derivatives and CDFs, exactly. Between consecutive nodes both
densities are smooth; interior extrema of L = log p̂ − log p̂_i are located
and added as nodes, so L is monotone on every interval (for Gaussian rows
without ε_i they stay inside their intervals, integrated on both sides:
:func:`empdp.risk.cuts._turn_sums`). Then

    δ_i(ε) = max( ∫_{L>ε} (p̂ − e^ε p̂_i),  ∫_{L<−ε} (p̂_i − e^ε p̂) )

is a sum of exact CDF differences over intervals entirely inside the region,
plus, on the one or two intervals a level ε cuts, a partial integral whose
endpoint is the root of a cubic Hermite model of L and whose mass comes from a
quartic-corrected Hermite model of the density matched to the exact interval
mass. The error there is second order in the root error (the integrand
vanishes at the root), far below 1e-9 at the node spacing used. Tails beyond
the outermost nodes carry less than 1e-17 of mass (Laplace: 46 scales;
Gaussian: 12 standard deviations) and are added with the log-ratio frozen at
its end value. Laplace kernels of several bandwidths get nodes farther out, to
where every kernel narrower than the widest is below 1e-20/n of a widest one
(:func:`empdp.risk.grid._tails`, in closed form): on the way L may rise past its
limit, far beyond the data. Where the matrix form evaluates the nodes, the
masses come from the CDFs' tails (F = G + K, :func:`empdp.risk.laplace.direct`),
so the right tail's keep their digits as the left tail's do.

ε_i, Laplace kernels: sup_x |L(x)|, the largest |L| over the nodes (which
include the interior extrema) and the exact tail limits; δ_i(ε) = 0 exactly
for ε ≥ ε_i.

ε_i, Gaussian kernels: L grows without bound in the tails (linearly, where one
kernel dominates), so sup |L| = ∞ and δ_i(ε) > 0 for every ε. ε_i is reported
at the tolerance τ = :data:`EPS_TOLERANCE` (1e-12) instead:

    ε_i(τ) = min { ε ≥ 0 : δ_i(ε) ≤ τ },

the root of a non-increasing function, bracketed by the certified bound
:func:`eps_upper_bound` and found by safeguarded Newton steps on log δ_i to a
relative 1e-10 (:func:`empdp.risk.gaussian.tolerance_eps`). Near τ the masses are
those of far tails, integrated from Hermite models of the log-densities. δ_i
at or below τ is reported as 0, so δ_i(ε) = 0 is reported for ε ≥ ε_i(τ); the
outputs state τ (``eps_tolerance``). For Gaussian kernels p̂_i is evaluated on
a block's shared grid by a series with a certified remainder, one matrix
product per block (:mod:`empdp.risk.gaussian`), rows with large shifts directly.
"""

from .bounds import EPS_TOLERANCE, GAUSSIAN_TOL, delta_upper_bound, eps_upper_bound, gaussian_eps_bound, term_delta
from .exact import BLOCK_CELLS, evaluate, evaluate_on_grid, grid_plan, total_risk
from .grid import base_grid
from .nodes import node_values, sweep_delta

__all__ = ["EPS_TOLERANCE", "GAUSSIAN_TOL", "BLOCK_CELLS", "base_grid", "delta_upper_bound", "eps_upper_bound",
           "evaluate", "evaluate_on_grid", "gaussian_eps_bound", "grid_plan", "node_values", "sweep_delta",
           "term_delta", "total_risk"]
