"""The scoring tests' one trained experiment (:func:`scoring_fixtures.train_experiment`).

Trained once per session and shared by ``test_load_model``, ``test_transformer`` and
``test_score_job``: they only read it (a test that changes a store copies it first).
"""

from __future__ import annotations

import pytest
from scoring_fixtures import Trained, train_experiment


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """breast_cancer trained by a grid of two MLPs; its held-out rows kept aside."""
    return train_experiment(tmp_path_factory.mktemp("bc"))
