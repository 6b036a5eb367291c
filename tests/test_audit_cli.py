"""``empdp audit`` CLI: exit codes, exact JSON keys, user samplers, pairs files; release audit."""

import json
import warnings

import numpy as np
import pytest
from audit_cli_helpers import run
from helpers import CURATOR_KEY, SAMPLE, one_line_error

import empdp.cli.main as main_mod
from empdp.audit import audit_release
from empdp.cli.audit import audit

pytestmark = pytest.mark.usefixtures("curator_key")  # $EMPDP_KEY verifies the signed calibrations

assert main_mod.cli.get_command(None, "audit") is audit  # registered in cli/main.py

KEYS = {"lower_bound", "stage1_max_loss", "pair", "t_hat", "search_size", "final_size", "alpha", "true_value"}
RENYI_KEYS = {"lower_bound", "estimate", "pair", "t_hat", "sample_size", "alpha", "true_value"}


def test_mpl_json_builtin():
    res = run("mpl", "-m", "laplace", "--param", "epsilon=0.7", "--search-size", 3000, "--final-size", 8000,
              "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert KEYS <= set(d)
    assert d["true_value"] == 0.7 and d["search_size"] == 3000 and d["final_size"] == 8000 and d["alpha"] == 0.05
    assert d["lower_bound"] <= d["loss_at_t_hat"]


def test_renyi_json_and_human_output():
    res = run("renyi", "-m", "randomized_response", "--order", 2, "--sample-size", 5000, "--seed", 2, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert RENYI_KEYS <= set(d) and d["t_hat"] is None and d["discrete"] is True and d["sample_size"] == 5000
    res = run("renyi", "-m", "gaussian", "--order", 2, "--sample-size", 5000, "--seed", 2)
    assert res.exit_code == 0 and "lower bound" in res.output


def test_infinite_true_value_is_null_in_json():
    res = run("mpl", "-m", "svt5", "--search-size", 2000, "--final-size", 5000, "--seed", 3, "--json")
    d = json.loads(res.output)
    assert d["true_value"] is None and d["true_value_infinite"] is True


def test_user_sampler_and_pairs_file(tmp_path, monkeypatch):
    (tmp_path / "mymech.py").write_text(
        "import numpy as np\n"
        "def sampler(database, size, rng, scale=1.0):\n"
        "    return float(np.sum(database)) + rng.laplace(0, scale, size)\n")
    (tmp_path / "pairs.json").write_text(json.dumps([[0, 1], [[0, 0], [0, 0.5]]]))
    monkeypatch.chdir(tmp_path)
    res = run("mpl", "-m", "mymech:sampler", "--param", "scale=2", "--pairs", "pairs.json",
              "--region", "-1,1", "--search-size", 3000, "--final-size", 8000, "--seed", 4, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["true_value"] is None and d["pair"] == [0, 1]


@pytest.mark.parametrize("args,fragment", [
    (("mpl", "-m", "nope"), "unknown mechanism 'nope'"),
    (("mpl", "-m", "laplace", "--param", "eps=1"), "no parameter 'eps'"),
    (("mpl", "-m", "laplace", "--param", "epsilon=-1"), "epsilon must be > 0"),
    (("mpl", "-m", "laplace", "--region", "1"), "LO,HI"),
    (("mpl", "-m", "laplace", "--pairs", "missing.json"), "does not exist"),
    (("mpl", "-m", "laplace", "--pairs", "patterns"), "StatDP patterns do not apply"),
    (("renyi", "-m", "gaussian", "--order", 1), "order must be"),
    (("mpl", "-m", "nomodule_xyz:f"), "cannot import module"),
])
def test_bad_input_one_line_exit_2(args, fragment):
    one_line_error(run(*args), fragment)


def test_release_audit_on_constructed_calibration():
    from empdp.noise import calibrate_values

    rng = np.random.default_rng(0)
    q = rng.normal(10, 1, 40)
    shifts = np.zeros((30, 40))
    shifts[np.arange(30), rng.integers(0, 40, 30)] = rng.normal(0, 0.5, 30)

    class Loo:
        pass

    loo = Loo()
    loo.q, loo.shifts, loo.ids = q, shifts, [f"id{i}" for i in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate_values(q, shifts, epsilon=0.5, kernel="laplace")
    res = audit_release(cal, loo=loo, top=3, n=5000, N=20000, n_renyi=20000, rng=1)
    assert res.exact_epsilon_max <= 0.5 + 1e-9
    assert res.mpl_lower_bound <= res.exact_epsilon_max
    assert res.renyi_lower_bound <= res.exact_renyi_max
    assert res.ok and res.renyi_consistent and len(res.individuals) == 3
    # a bound above the exact value is flagged (but is not a failure of the target)
    import dataclasses

    high = dataclasses.replace(res, renyi_lower_bound=2 * res.exact_renyi_max + 1e-6)
    assert high.ok and not high.renyi_consistent and high.to_dict()["renyi_consistent"] is False


def test_release_cli_on_sample_data(tmp_path):
    from empdp.noise import calibrate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(SAMPLE, id="countyid", by="year", query="mean(murdrate)", epsilon=1.0)
    path = tmp_path / "cal.json"
    cal.save(path, key=CURATOR_KEY)  # signed: audit release checks the signature first
    res = run("release", path, SAMPLE, "--top", 3, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["exact_epsilon_max"] <= 1.0 + 1e-9 and d["mpl_lower_bound"] <= 1.0 and d["ok"]
    assert d["renyi_consistent"] == (d["renyi_lower_bound"] <= d["exact_renyi_max"] * (1 + 1e-9) + 1e-12)


# ---------------------------------------------------------------- help and option names (issue 22, item 8)

@pytest.mark.parametrize("command", ["mpl", "renyi", "release"])
def test_every_subcommand_has_its_own_examples(command):
    res = run(command, "--help")
    assert res.exit_code == 0, res.output
    examples = res.output.split("Examples:")[1].split("Options:")[0]
    lines = [ln.strip() for ln in examples.splitlines() if ln.strip()]
    assert len(lines) >= 3 and all(ln.startswith(f"empdp audit {command} ") for ln in lines), examples
    assert "fresh randomness" in res.output  # --seed states its default


def test_help_names_sizes_apart_hides_old_names_and_lists_every_builtin():
    from empdp.audit import BUILTIN_NAMES

    mpl_help, renyi_help = run("mpl", "--help").output, run("renyi", "--help").output
    assert "--search-size" in mpl_help and "--final-size" in mpl_help and "--sample-size" in renyi_help
    for text in (mpl_help, renyi_help):
        assert "--n " not in text and "--N " not in text  # the old names work, unlisted
        assert "--pairs FILE" in text
        flat = " ".join(text.split())
        assert all(name in flat for name in BUILTIN_NAMES)
    assert "--hash-key-file FILE" in run("release", "--help").output


def test_old_size_names_still_work():
    new = run("mpl", "-m", "laplace", "--search-size", 2000, "--final-size", 5000, "--seed", 1, "--json")
    old = run("mpl", "-m", "laplace", "--n", 2000, "--N", 5000, "--seed", 1, "--json")
    assert new.exit_code == old.exit_code == 0 and json.loads(new.output) == json.loads(old.output)
    assert json.loads(old.output)["search_size"] == 2000 and json.loads(old.output)["final_size"] == 5000
    new = run("renyi", "-m", "gaussian", "--order", 2, "--sample-size", 2000, "--seed", 1, "--json")
    old = run("renyi", "-m", "gaussian", "--order", 2, "--n", 2000, "--seed", 1, "--json")
    assert new.exit_code == old.exit_code == 0 and json.loads(new.output) == json.loads(old.output)


def test_old_and_new_size_names_must_agree():
    one_line_error(run("mpl", "-m", "laplace", "--search-size", 2000, "--n", 3000), "--search-size", "--n")
    one_line_error(run("renyi", "-m", "gaussian", "--order", 2, "--sample-size", 2000, "--n", 3000),
                   "--sample-size", "--n")
