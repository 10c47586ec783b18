"""The parametric score model of HyperSched §6 and the params-to-curve mapping."""

from __future__ import annotations

import numpy as np
import pytest

from cerebro_spark.simulate import SIMULATED_SPACE, Curve, ParametricWorkload, parametric_score


def test_score_formula_by_hand() -> None:
    # (2 - (1 / (0.01*b0*k + 0.1*b1 + 0.5) + 0.01*b2)) / 2
    assert parametric_score(0, 0.0, 0.0, 0.0) == pytest.approx(0.0)
    assert parametric_score(100, 0.5, 1.0, 1.0) == pytest.approx((2 - (1 / 1.1 + 0.01)) / 2)
    assert parametric_score(500, 0.1, 0.0, 0.5) == pytest.approx((2 - (1 / 1.0 + 0.005)) / 2)
    curve = Curve(0.2, 0.3, 0.4)
    assert curve.score(250) == parametric_score(250, 0.2, 0.3, 0.4)
    assert curve.limit == pytest.approx(0.998)


def test_scores_rise_with_steps_towards_the_limit() -> None:
    curve = Curve(0.3, 0.5, 0.5)
    scores = [curve.score(k) for k in range(0, 5000, 100)]
    assert scores == sorted(scores)
    assert scores[-1] < curve.limit


def test_curves_are_a_function_of_params_and_seed() -> None:
    workload = ParametricWorkload(seed=3)
    params = {"lr": 0.01, "weight_decay": 1e-4, "momentum": 0.9}
    assert workload.curve(params) == workload.curve(dict(reversed(params.items())))
    assert workload.curve(params) != ParametricWorkload(seed=4).curve(params)
    assert workload.curve(params) != workload.curve({**params, "lr": 0.1})
    assert workload.score(params, 3) == workload.curve(params).score(30)


def test_coefficients_follow_the_papers_distributions() -> None:
    workload = ParametricWorkload(seed=0)
    curves = [workload.curve(p) for p in SIMULATED_SPACE.grid()]
    assert len(curves) == 144  # HyperSched Table 2: 9 x 4 x 4
    b0 = np.array([c.b0 for c in curves])
    b1 = np.array([c.b1 for c in curves])
    assert (b0 >= 0).all()
    assert b0.mean() == pytest.approx(0.1, abs=0.03)  # Exp(scale 0.1)
    assert ((b1 >= 0) & (b1 <= 1)).all()
    assert b1.mean() == pytest.approx(0.5, abs=0.1)
