import numpy as np
import pandas as pd
import pytest

from empdp.settings import Model


def random_panel(seed: int, n_db: int = 5, n_ind: int = 14, p_absent: float = 0.3, ties: bool = True) -> pd.DataFrame:
    """A small repeated-database table: multi-row individuals, absences, ties and a sole contributor."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in range(n_db):
        for i in range(n_ind):
            if rng.random() < p_absent:
                continue
            for _ in range(rng.integers(1, 4)):
                x = float(rng.integers(0, 5)) if ties else float(rng.normal(3, 1))
                rows.append((f"id {i}", 2000 + j, x, float(rng.random() + 0.5), int(rng.integers(0, 2))))
    # database 2005 has a single contributor: removing them leaves it empty
    rows.append(("solo", 2000 + n_db, 2.0, 1.0, 1))
    rows.append(("solo", 2000 + n_db, 3.0, 1.5, 0))
    return pd.DataFrame(rows, columns=["id", "year", "x", "w", "flag"])


@pytest.fixture
def panel_df():
    return random_panel(0)


@pytest.fixture(scope="session")
def sample_path():
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1] / "sample_data" / "countymurders.parquet")


@pytest.fixture(scope="session")
def sample_assessment(sample_path):
    """The sample data assessed with a fixed model (no bandwidth search keeps it fast)."""
    from empdp.assessment import assess

    return assess(sample_path, id="countyid", by="year", query="mean(murdrate)",
                  model=Model(kernel="laplace", bandwidth=0.05))


@pytest.fixture
def curator_key(monkeypatch):
    """$EMPDP_KEY set to ``helpers.CURATOR_KEY``: the CLI signs and verifies with it (release needs one).
    Test files that release put ``pytestmark = pytest.mark.usefixtures("curator_key")``."""
    from helpers import CURATOR_KEY

    monkeypatch.setenv("EMPDP_KEY", CURATOR_KEY.decode())


@pytest.fixture(scope="module")
def curator_key_module():
    """$EMPDP_KEY set for a whole module (for module-scoped fixtures that calibrate and release)."""
    from helpers import CURATOR_KEY

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMPDP_KEY", CURATOR_KEY.decode())
        yield


@pytest.fixture(scope="module")
def cal_path(tmp_path_factory):
    """A calibration signed with ``helpers.CURATOR_KEY``, at epsilon 0.1 of 15 databases and 40 individuals,
    noise added (modules that need another define their own ``cal_path``)."""
    from test_release_security import KEY, make_calibration

    path = tmp_path_factory.mktemp("cal") / "cal.json"
    make_calibration().save(path, key=KEY)
    return path


def local_spark():
    """A local Spark session for a test module (the Spark tests' ``spark`` fixture): two cores, two
    partitions, no code generation (tiny tables: compiling generated code costs more than it saves);
    stopped when the module is done."""
    from empdp.spark import spark_session

    session = spark_session("local[2]", config={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
