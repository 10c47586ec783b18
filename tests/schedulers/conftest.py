"""Airflow for the DAG test (``test_airflow.py``): its venv and a migrated database.

Airflow lives in a virtual environment of its own (:func:`tests.background.build_venv`:
``apache-airflow`` pinned, installed with uv, cached in pytest's cache directory, so one
CI run builds it once). Its metadata database is made once a session by
``airflow db migrate`` (about 25 CPU-seconds) and copied into each test's
``AIRFLOW_HOME``: it holds no path. Both begin in the background as soon as collection is
done, when a collected test uses them (:mod:`tests.background`): the tests that run before
hide them.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from pipeline_helpers import Airflow, airflow_env

from tests.background import Background, BuildError, build_venv, needed, run_step

AIRFLOW_VERSION = "3.3.2"
logger = logging.getLogger(__name__)


def _build(config: pytest.Config) -> Airflow:
    venv = Path(config.cache.mkdir(f"airflow-{AIRFLOW_VERSION}-venv"))
    python = build_venv(
        venv,
        f"apache-airflow=={AIRFLOW_VERSION}",
        check=f"import airflow; assert airflow.__version__ == {AIRFLOW_VERSION!r}",
    )
    home = Path(tempfile.mkdtemp(prefix="cerebro-airflow-home-"))
    migrate = [str(python.parent / "airflow"), "db", "migrate"]
    run_step(migrate, "airflow db migrate", 600, env=airflow_env(home))
    return Airflow(python, home / "airflow.db")


_AIRFLOW: Background[Airflow] = Background("Airflow", _build)


def pytest_collection_finish(session: pytest.Session) -> None:
    if needed(session, "airflow"):
        _AIRFLOW.start(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    made = _AIRFLOW.done_value()  # a build the session started ends before the session does
    if made is not None:
        shutil.rmtree(made.database.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow(request: pytest.FixtureRequest) -> Airflow:
    """Airflow ``AIRFLOW_VERSION`` in its venv, and a migrated metadata database."""
    try:
        made = _AIRFLOW.result(request.config)
    except BuildError as error:
        pytest.fail(f"Airflow {AIRFLOW_VERSION} could not be set up: {error}", pytrace=False)
    logger.warning("Airflow was ready after %.0f s (in the background)", _AIRFLOW.seconds)
    return made
