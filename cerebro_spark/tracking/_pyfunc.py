"""The best checkpoint as an MLflow pyfunc model (what ``mlflow.register_model`` takes).

Importing this module imports MLflow (``pip install 'cerebro-spark[tracking]'``).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from mlflow.pyfunc.model import PythonModel

from cerebro_spark.scoring import load_model

CHECKPOINT_ARTIFACT = "checkpoint"


class CheckpointModel(PythonModel):
    """An MLflow pyfunc model over a cerebro-spark checkpoint.

    Loading it builds the network with :func:`cerebro_spark.load_model` (the checkpoint
    carries its spec, dataset metadata and labels); ``predict`` takes a pandas DataFrame
    with the feature columns (or an array) and returns the predicted labels (classes)
    or values (regression). The model's spec module must be importable where it is
    loaded, as for :func:`~cerebro_spark.load_model`.
    """

    def load_context(self, context: Any) -> None:
        """Load the checkpoint artifact."""
        self.model = load_model(context.artifacts[CHECKPOINT_ARTIFACT], device="cpu")

    # No type hints: MLflow would read them as the model's input schema.
    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        """Predict labels or values for ``model_input``."""
        del context, params
        return self.model.predict(model_input)


def save_pyfunc(path: str | Path, checkpoint: str | Path) -> None:
    """Write a pyfunc model of ``checkpoint`` to the new directory ``path``."""
    import mlflow.pyfunc

    requirements = [f"cerebro-spark=={_version('cerebro-spark')}"]
    for package in ("torch", "pandas", "numpy"):
        requirements.append(f"{package}=={_version(package)}")
    mlflow.pyfunc.save_model(
        str(path),
        python_model=CheckpointModel(),
        artifacts={CHECKPOINT_ARTIFACT: str(checkpoint)},
        pip_requirements=requirements,
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "0"
