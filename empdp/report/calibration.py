"""The report's calibration section: the noise ``empdp calibrate`` chose and why (docs/method.md)."""

from __future__ import annotations

from .markup import Html, esc, explain, extra_rows, inf_if_none, kv, num, section

#: calibration JSON keys the section shows in its own rows or leaves out as bookkeeping (format, timings,
#: the query's parts, notes shown below the table)
_SHOWN = {"epsilon", "lambda", "lambda_winf", "lambda_hausdorff", "curator_kernel", "noise",
          "expected_abs_noise", "verified_eps_max", "classical_dp_epsilon", "classical_dp_explanation",
          "guarantee", "format", "seconds", "n_bisected", "expected_abs_noise_plain_laplace",
          "source", "source_description", "id", "by", "query", "where", "sql", "query_description",
          "n_individuals", "n_sole_contributors", "n_databases"}


def _noise_text(noise: dict) -> Html:
    kind = noise.get("kind", "–")
    w, lam = noise.get("weight_zero"), noise.get("scale")
    if kind == "none":
        return Html("no noise is added: the curator's density model is already ε-private for every individual "
                "(the assessment finds nobody at risk at this ε), so a release publishes the exact value")
    if kind == "laplace_mixture":
        return Html("with probability {} add nothing, otherwise add Laplace noise of scale {}").format(num(w), num(lam))
    return Html("{} noise of scale {}").format(kind, num(lam))


def calibration(c: dict) -> str:
    """The ``calibration`` section of a calibration summary (the JSON ``empdp calibrate`` writes)."""
    noise = c.get("noise") or {}
    ck = c.get("curator_kernel") or {}
    kind = noise.get("kind", "–")
    query = c.get("query_description") or c.get("query") or c.get("sql")
    rows = [("query", esc(f"{query} on {c.get('source_description') or c.get('source')}")) if query else None,
            ("target ε", num(c.get("epsilon"))),
            ("λ* (least Laplace smoothing that reaches ε)", num(c.get("lambda"))),
            ("λ by W∞ bound (valid, larger)", num(c.get("lambda_winf"))),
            ("λ by Hausdorff rule (paper; not a valid guarantee)", num(c.get("lambda_hausdorff"))),
            ("curator kernel", Html("{}, scale {}").format(ck.get("kind", "–"), num(ck.get("scale")))),
            ("noise", _noise_text(noise)),
            ("expected |noise| (expected error)", num(c.get("expected_abs_noise"))),
            ("verified_eps_max: the largest exact εᵢ at λ*", num(c.get("verified_eps_max"))),
            ("individuals", Html("{} ({} sole contributor(s): no noise protects them)").format(
                num(c.get("n_individuals")), num(c.get("n_sole_contributors")))) if "n_individuals" in c else None,
            ("classical DP ε (fixed database)", "not claimed (see below)" if kind == "laplace"
             else num(inf_if_none(c.get("classical_dp_epsilon"))))]
    rows = [r for r in rows if r is not None]
    rows += extra_rows(c, _SHOWN)
    parts = []
    if c.get("private") is False or c.get("seed") is not None:
        parts.append('<div class="warn"><strong>Not private:</strong> this calibration was made with a fixed '
                     'seed for testing; its noise is reproducible and must not be used for a release.</div>')
    parts.append(kv(rows))
    parts += [f'<div class="warn">{esc(w)}</div>' for w in c.get("warnings") or []]
    classical = c.get("classical_dp_explanation") or "for a fixed database the atom at zero makes it infinite"
    parts.append(explain(
        "The release adds noise to the statistic so that every individual is protected at the target ε. λ* is "
        "the smallest Laplace smoothing scale for which this holds, verified for every individual. The noise is "
        "the part of that smoothing the curator's own density estimate does not already provide, so with "
        "some probability nothing is added. The guarantee is " + esc(c.get("guarantee") or
                                                                    "empirical (with respect to the variation "
                                                                    "between databases)")
        + ". Classical DP ε: " + esc(classical) + "."))
    return section("calibration", "Noise calibration", *parts)
