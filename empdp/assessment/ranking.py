"""The riskiest individuals at a stated ε, exact (``Assessment.riskiest``).

Ranked by exact δ_i(ε), ties by exact ε_i, sole contributors first; the individual that sets
ε_all is always included. Exact values are computed only for the rows that can rank, in
decreasing order of certified upper bounds (branch and bound).
"""

from __future__ import annotations

import math

import numpy as np

from .. import risk


def eps_all_code(a) -> int:
    """Row of the individual whose exact ε_i is ε_all (-1 when every ε_i is 0 or unknown)."""
    e = a.individuals["eps_i"].fill_null(np.nan).to_numpy().astype(float)
    e = np.where(a.individuals["sole_contributor"].to_numpy(), np.nan, e)
    if not np.isfinite(e).any() or np.nanmax(e) <= 0:
        return -1
    return int(np.nanargmax(e))


class Ranking:
    """Branch and bound for :meth:`Assessment.riskiest`: exact values only where a row can rank.

    Upper bounds: δ_i(ε) ≤ δ_i(ε_min) for ε ≥ ε_min (δ_i decreases in ε; δ_i(ε_min) is exact for
    every individual) and the screening bound ``risk.delta_upper_bound``; ε_i ≤ ``eps_bound``.
    """

    BATCH = 256

    def __init__(self, a, eps: float):
        self.a, self.eps = a, eps
        ind = a.individuals
        self.sole = ind["sole_contributor"].to_numpy()
        self.bound = ind["eps_bound"].to_numpy().astype(float)
        known_eps = ind["eps_i"].fill_null(np.nan).to_numpy().astype(float)
        self.eps_i = known_eps.copy()
        self.delta = np.full(len(self.sole), np.nan)
        first = ind["delta"].to_numpy().astype(float)
        e0 = float(a.epsilons[0])
        n_present = ind["n_databases"].to_numpy()
        if a.buckets:  # each bucket's bound (n_iB/n_B) δ_kernel(ε; M_iB) is at most δ_kernel(ε; M_i)
            upper = risk.term_delta(a.model.kernel, eps, self.bound)
        else:
            upper = risk.delta_upper_bound(a.model.kernel, eps, self.bound, n_present, a.n_databases)
        if math.isclose(eps, e0, rel_tol=1e-12, abs_tol=0.0):
            self.delta[:] = first  # exact for every individual
            upper = first
        elif eps > e0:
            upper = np.minimum(upper, first)
        if a.model.kernel.exact_eps:  # δ_i(ε) = 0 for ε ≥ M_i
            upper = np.where(self.bound <= eps, 0.0, upper)
        upper = np.where(self.sole, 1.0, upper)
        self.upper = upper
        self.delta[self.sole] = 1.0
        self.eps_i[self.sole] = np.inf

    def _evaluate(self, codes: np.ndarray) -> None:
        todo = codes[np.isnan(self.delta[codes]) | np.isnan(self.eps_i[codes])]
        if len(todo):
            self.eps_i[todo], self.delta[todo] = self.a.exact_risk(todo, self.eps)

    def top(self, k: int):
        m = len(self.sole)
        k = max(0, min(k, m))
        chosen = np.empty(0, dtype=np.int64)
        if k:
            # 1. by δ_i(ε): rows in decreasing order of their bound until the k-th exact δ beats the next bound
            order = np.argsort(-self.upper, kind="stable")
            pos = 0
            while pos < m:
                kth = np.sort(np.nan_to_num(self.delta[order[:pos]], nan=0.0))[::-1]
                kth = kth[k - 1] if len(kth) >= k else 0.0
                if self.upper[order[pos]] <= 0 or (len(order[:pos]) >= k and self.upper[order[pos]] < kth):
                    break
                end = min(m, pos + max(self.BATCH, k))
                self._evaluate(order[pos:end])
                pos = end
            looked = order[:pos]
            positive = looked[self.delta[looked] > 0]
            chosen = positive
            if len(chosen) < k:
                # 2. the rest at δ_i(ε) = 0, by exact ε_i: decreasing bounds until the next cannot enter
                rest = np.setdiff1d(np.arange(m), chosen)
                rest = rest[np.argsort(-self.bound[rest], kind="stable")]
                need, pos = k - len(chosen), 0
                while pos < len(rest):
                    seen = np.sort(np.nan_to_num(self.eps_i[rest[:pos]], nan=-1.0))[::-1]
                    if pos >= need and self.bound[rest[pos]] < seen[need - 1]:
                        break
                    end = min(len(rest), pos + max(self.BATCH, need))
                    self._evaluate(rest[pos:end])
                    pos = end
                chosen = np.concatenate([chosen, rest[:pos]])
            self._evaluate(chosen)
            rank = np.lexsort((-self.eps_i[chosen], -self.delta[chosen]))
            chosen = chosen[rank][:k]
        setter = eps_all_code(self.a)
        if setter >= 0 and setter not in chosen:
            self._evaluate(np.array([setter]))
            chosen = np.append(chosen, setter)
        return chosen, self.delta[chosen], self.eps_i[chosen]
