"""``audit release`` on a calibration against an adversary: every bucket's release audited apart.

Bucket B's release density is P̂_B ⋆ ℓ_{b_B} ⋆ h (its databases, its curator scale, the common
noise law). Checked: a calibrated release meets its target in every bucket, and the per-bucket
exact values match a dense-grid reference; an under-noised release is flagged in the bucket that
needs more noise (and only there); one bucket audits exactly as the plain calibration; bad input
is one line, exit 2. Small panels and samples, fixed seeds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings

import numpy as np
import pandas as pd
import pytest
from helpers import CURATOR_KEY, one_line_error, run, settings
from numpy.testing import assert_allclose

import empdp.audit
from empdp import calibrate
from empdp.audit import audit_release
from empdp.audit.release import describe_buckets
from empdp.errors import InputError
from empdp.loo import leave_one_out
from empdp.noise.deconv import laplace_closed_form

EPS = 0.5
#: small samples: the bounds are loose but every check below has a wide margin
SIZES = dict(top=2, n=3000, N=10000, n_renyi=3000)
BUCKET_KEYS = {"lo", "hi", "n_databases", "curator_kernel", "alpha", "ok", "renyi_consistent", "mpl_lower_bound",
               "stage1_max_loss", "exact_epsilon_max", "renyi_lower_bound", "exact_renyi_max", "individuals",
               "delta", "approx_lower_bound", "exact_epsilon_at_delta_max", "exact_curve"}


def panel(seed: int, high_spike: float = 4.0, low_spike: float = 0.0, n_db: int = 24, n_ind: int = 30):
    """Two seasons alternating; the query spreads 8 times less in the high one. Individual 'k' adds
    ``high_spike`` in the high season only, 'm' adds ``low_spike`` in the low season only: knowing
    the season, each stands out in their own bucket."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in range(n_db):
        high = j % 2
        level = 10 + 30 * high
        rows += [(f"c{i}", 2000 + j, level + rng.normal(0, 1 if high else 8), high) for i in range(n_ind)]
        rows.append(("k", 2000 + j, level + rng.normal(0, 1) + high_spike * high, high))
        rows.append(("m", 2000 + j, level + rng.normal(0, 1) + low_spike * (1 - high), high))
    return pd.DataFrame(rows, columns=["id", "db", "x", "season"])


def _calibrate(df, eps=EPS, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate(df, id="id", by="db", query="mean(x)", epsilon=eps, **settings(**kw))


def _stored(cal):
    return cal.deconvolution["adversary"]["buckets"]


def _with_noise(cal, lam):
    """The calibration with the noise of scale ``lam`` (0: none) in place of its own."""
    noise = laplace_closed_form(cal.curator_kernel["scale"], lam)
    return dataclasses.replace(cal, lam=lam, noise=noise.to_dict(), expected_abs_noise=noise.expected_abs)


def _released(x, points, b, w, lam):
    """P̂ ⋆ ℓ_b ⋆ (w δ_0 + (1 − w) ℓ_λ) at x, term by term (the slow, obvious reference)."""
    u = np.abs(x[:, None] - points[None, :])
    lap = lambda t: np.exp(-u / t) / (2 * t)  # noqa: E731
    if w >= 1:
        return lap(b).mean(axis=1)
    conv = (lam * lam * lap(lam) - b * b * lap(b)) / (lam ** 2 - b ** 2)  # ℓ_b ⋆ ℓ_λ
    return (w * lap(b) + (1 - w) * conv).mean(axis=1)


@pytest.fixture(scope="module")
def knows_k():
    """Only 'k' stands out (in the high season): one bucket needs noise, the other not."""
    df = panel(1)
    return df, _calibrate(df, adversary="max(season)", buckets=2), leave_one_out(df, id="id", by="db",
                                                                                 query="mean(x)")


@pytest.fixture(scope="module")
def knows_both():
    """'k' stands out in the high season and 'm' in the low one: both buckets need noise, different λ*_B."""
    df = panel(3, low_spike=20.0)
    return df, _calibrate(df, adversary="max(season)", buckets=2), leave_one_out(df, id="id", by="db",
                                                                                 query="mean(x)")


def test_every_bucket_of_a_calibrated_release_meets_its_target(knows_k):
    _, cal, loo = knows_k
    stored = _stored(cal)
    w, lam = cal.noise["weight_zero"], cal.noise["scale"]
    assert 0 < w < 1 and [b["n_databases"] for b in stored] == [12, 12]
    # the low season's own model is already private: its λ*_B (the larger) does not set the noise,
    # which only smooths its release further (the reference below checks that it stays within ε)
    assert stored[0]["eps_all_at_scale"] <= EPS < stored[1]["eps_all_at_scale"]
    assert lam == cal.lam == stored[1]["lambda"] < stored[0]["lambda"]
    ids = loo.ids.to_list()
    for seed in (1, 2, 3):  # each bucket's bounds hold with probability ≥ 1 − alpha/2: all six, by a wide margin
        res = audit_release(cal, loo=loo, alpha=0.05, rng=seed, **SIZES)
        assert res.ok and len(res.buckets) == 2
        for b, s in zip(res.buckets, stored):
            assert b.ok and b.alpha == 0.025 and b.mpl_lower_bound <= EPS and b.exact_epsilon_max <= EPS * (1 + 1e-9)
            assert (b.lo, b.hi, b.n_databases, b.curator_kernel["scale"]) == (s["lo"], s["hi"], 12, s["scale"])
    # the exact values are those of each bucket's own release density (dense-grid reference)
    for b, s in zip(res.buckets, stored):
        cols = np.array([loo.labels.index(v) for v in s["databases"]])
        q = loo.q[cols]
        x = np.linspace(q.min() - 40 * lam, q.max() + 40 * lam, 40_001)
        for row in b.individuals:
            shifted = q - loo.shifts[ids.index(row["id"]), cols]
            x_all = np.sort(np.concatenate([x, q, shifted]))
            ref = np.abs(np.log(_released(x_all, q, s["scale"], w, lam))
                         - np.log(_released(x_all, shifted, s["scale"], w, lam))).max()
            assert_allclose(row["exact_epsilon"], ref, rtol=1e-6)
    # 'k' sets the high season's figures; the overall ones are the largest over the buckets
    assert res.buckets[1].individuals[0]["id"] == "k"
    assert res.exact_epsilon_max == max(b.exact_epsilon_max for b in res.buckets)
    assert res.mpl_lower_bound == max(b.mpl_lower_bound for b in res.buckets)
    assert res.worst_bucket == int(np.argmax([b.exact_epsilon_max for b in res.buckets]))


@pytest.mark.parametrize("tamper", ["smallest lambda", "no noise"])
def test_an_under_noised_release_is_flagged_in_the_bucket_that_needs_more_noise(knows_both, tamper):
    _, cal, loo = knows_both
    stored = _stored(cal)
    lam_b = [b["lambda"] for b in stored]
    assert min(lam_b) < cal.lam == max(lam_b)  # both buckets need noise, the low season more
    assert all(b["eps_all_at_scale"] > EPS for b in stored)
    lam = min(lam_b) if tamper == "smallest lambda" else 0.0
    res = audit_release(_with_noise(cal, lam), loo=loo, rng=1, **SIZES)
    d = res.to_dict()
    assert not res.ok and not d["ok"]
    # a bucket fails exactly when the noise is below its λ*_B, and the black-box bound sees it
    need = [lam < b * (1 - 1e-9) for b in lam_b]
    assert [b["ok"] for b in d["buckets"]] == [not n for n in need], d["buckets"]
    for b, n in zip(d["buckets"], need):
        assert (b["exact_epsilon_max"] > EPS) is n and (b["mpl_lower_bound"] > EPS) is n
    assert need[d["worst_bucket"]]
    if tamper == "smallest lambda":  # only the low season (bucket 0, where 'm' stands out) needs more
        assert need == [True, False] and d["worst_bucket"] == 0
        assert d["buckets"][0]["individuals"][0]["id"] == "m"
    else:  # no noise: each bucket's release is its own model, whose ε_all the calibration stored
        assert_allclose([b["exact_epsilon_max"] for b in d["buckets"]], [b["eps_all_at_scale"] for b in stored],
                        rtol=1e-6)
    lines = describe_buckets(d)
    assert f"worst bucket: {d['worst_bucket']} (max(season) in" in lines[-1] and "needs more noise" in lines[-1]
    assert sum("FAILS" in ln for ln in lines) == sum(need)


def test_one_bucket_audits_as_the_plain_calibration(knows_k):
    df, _, loo = knows_k
    one = _calibrate(df, 0.2, adversary="max(season)", buckets=1)
    plain = _calibrate(df, 0.2)
    assert one.noise == plain.noise and one.noise["kind"] == "laplace_mixture" and one.lam == plain.lam
    a = audit_release(one, loo=loo, rng=5, **SIZES).to_dict()
    b = audit_release(plain, loo=loo, rng=5, **SIZES).to_dict()
    assert set(a) - set(b) == {"buckets", "worst_bucket", "adversary_statistic"}
    assert [{k: v for k, v in row.items() if k != "bucket"} for row in a.pop("individuals")] == b.pop("individuals")
    warned = a.pop("warnings")  # the same warnings, each naming the bucket
    assert len(warned) == len(b["warnings"]) and all(x.endswith(": " + y) for x, y in zip(warned, b.pop("warnings")))
    assert {k: a[k] for k in b} == b
    bucket = a["buckets"][0]
    assert bucket["alpha"] == b["alpha"] and bucket["n_databases"] == 24
    assert {k: bucket[k] for k in ("mpl_lower_bound", "exact_epsilon_max", "renyi_lower_bound")} == \
        {k: b[k] for k in ("mpl_lower_bound", "exact_epsilon_max", "renyi_lower_bound")}


# ------------------------------------------------------------------ CLI: JSON and bad input
@pytest.fixture
def files(tmp_path, knows_k, monkeypatch):
    """The panel as Parquet and its adversary calibration file; audits made small."""
    df, _, _ = knows_k
    data = tmp_path / "p.parquet"
    df.to_parquet(data)
    cal = _calibrate(str(data), adversary="max(season)", buckets=2)
    path = tmp_path / "cal.json"
    cal.save(path, key=CURATOR_KEY)  # signed: audit release checks the signature first
    monkeypatch.setenv("EMPDP_KEY", CURATOR_KEY.decode())
    monkeypatch.setattr(empdp.audit, "audit_release", functools.partial(audit_release, n=3000, N=10000,
                                                                        n_renyi=3000))
    return df, data, cal, path


def test_cli_json_reports_every_bucket(files):
    _, data, _, path = files
    res = run("audit", "release", path, data, "--top", 2, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["ok"] and d["adversary_statistic"] == "max(season)" and d["worst_bucket"] in (0, 1)
    assert [set(b) for b in d["buckets"]] == [BUCKET_KEYS, BUCKET_KEYS]
    assert [b["n_databases"] for b in d["buckets"]] == [12, 12] and [b["lo"] for b in d["buckets"]] == [0.0, 1.0]
    assert {"bucket", "id", "exact_epsilon"} <= set(d["individuals"][0])
    human = run("audit", "release", path, data, "--top", 1, "--seed", 1)
    assert human.exit_code == 0 and "OK" in human.output


@pytest.mark.parametrize("case,fragment", [
    ("source lacks a database", "which the source does not have"),
    ("source has another database", "is in no adversary bucket"),
    ("bucket without scale", "adversary bucket 1 needs"),
    ("a database in two buckets", "is in adversary buckets 0 and 1"),
    ("--top 0", "--top"),
])
def test_bad_input_is_one_line(files, tmp_path, case, fragment):
    df, data, cal, path = files
    if case.startswith("source"):
        other = df[df["db"] != 2005] if "lacks" in case else pd.concat([df, df[df["db"] == 2005].assign(db=1999)])
        data = tmp_path / "other.parquet"
        other.to_parquet(data)
    elif case.startswith(("bucket", "a database")):  # re-saved from Python: its digest matches, the content is bad
        deconv = json.loads(json.dumps(cal.deconvolution))
        buckets = deconv["adversary"]["buckets"]
        if "scale" in case:
            del buckets[1]["scale"]
        else:
            buckets[1]["databases"].append(buckets[0]["databases"][0])
        dataclasses.replace(cal, deconvolution=deconv).save(path, key=CURATOR_KEY)
    extra = ["--top", 0] if case == "--top 0" else []
    one_line_error(run("audit", "release", path, data, "--seed", 1, *extra), fragment)


def test_shifts_without_database_labels_are_refused(knows_k):
    _, cal, loo = knows_k

    class Bare:  # the arrays alone: the buckets cannot be found
        q, shifts = loo.q, loo.shifts

    with pytest.raises(InputError, match="labels"):
        audit_release(cal, loo=Bare(), rng=1, **SIZES)
