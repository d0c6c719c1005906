"""FedDTRE's mixing: phi, alpha bounds, the mix, what a client reports, how far a model moved."""

import math

import numpy as np
import pytest

from fedsim.trust_mixing import (
    ALPHA,
    S_GAP_SE,
    S_GLOBAL,
    S_LOCAL,
    SCORED,
    client_alpha,
    mix,
    relative_distance,
    trust_alpha,
    trust_phi,
)


@pytest.mark.parametrize("delta", [-1.0, -0.01, 0.0])
def test_phi_is_zero_unless_the_global_model_is_more_trusted(delta):
    assert trust_phi(delta, k=0.7, midpoint=0.01) == 0.0
    assert trust_alpha(0.5 + delta, 0.5, 0.7, 0.01, 0.1, 1.0) == pytest.approx(0.1)


def test_phi_by_hand_and_its_bounds():
    def sig(x, k=0.7, m=0.01):
        return 1 / (1 + math.exp(-k * (x - m)))

    assert trust_phi(0.3, 0.7, 0.01) == pytest.approx((sig(0.3) - sig(0)) / (sig(1) - sig(0)))
    assert trust_phi(1.0, 0.7, 0.01) == pytest.approx(1.0)
    assert trust_phi(1.7, 0.7, 0.01) == 1.0  # F1 differences reach 2: clipped
    alphas = [trust_alpha(d, 0.0, 0.7, 0.01, 0.1, 1.0) for d in np.linspace(-2, 2, 41)]
    assert min(alphas) == pytest.approx(0.1) and max(alphas) == pytest.approx(1.0)
    assert all(b >= a for a, b in zip(alphas, alphas[1:]))  # a larger trust gain never lowers alpha


def test_a_steeper_sigmoid_changes_phi():
    """k grows with training: the same small gain weighs differently as k grows."""
    phis = [trust_phi(0.2, k, 0.01) for k in (0.7, 2.0, 8.0)]
    assert len(set(phis)) == 3 and all(0 < p < 1 for p in phis)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="finite"):
        trust_phi(float("nan"), 0.7, 0.01)
    with pytest.raises(ValueError, match="alpha_min"):
        trust_alpha(0.2, 0.1, 0.7, 0.01, 0.6, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        mix({"w": np.zeros(2)}, {"w": np.ones(2)}, 1.5)
    with pytest.raises(ValueError, match="keys"):
        mix({"w": np.zeros(2)}, {"v": np.ones(2)}, 0.5)
    with pytest.raises(ValueError, match="shape"):
        mix({"w": np.zeros(2)}, {"w": np.ones(3)}, 0.5)


def test_mix_by_hand():
    local = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([[4.0]], np.float32)}
    global_ = {"a": np.array([3.0, 6.0], np.float32), "b": np.array([[0.0]], np.float32)}
    w = mix(local, global_, 0.25)
    np.testing.assert_allclose(w["a"], [1.5, 3.0])
    np.testing.assert_allclose(w["b"], [[3.0]])
    assert w["a"].dtype == np.float32


def test_client_alpha_scores_only_under_trust_mixing():
    calls = []

    def score(which):
        calls.append(which)
        return {"local": [0.1, 0.3, 0.2], "global": [0.5, 0.4, 0.6]}[which]

    assert client_alpha({"fixed_alpha": 0.25}, score) == (0.25, {}) and calls == []
    alpha, report = client_alpha(
        {"k": 0.7, "midpoint": 0.01, "alpha_min": 0.1, "alpha_max": 1.0}, score
    )
    assert calls == ["local", "global"] and report[SCORED] == 3
    assert report[S_LOCAL] == pytest.approx(0.2) and report[S_GLOBAL] == pytest.approx(0.5)
    # paired differences 0.4, 0.1, 0.4: sd 0.1732 (ddof 1), standard error sd / sqrt(3) = 0.1
    assert report[S_GAP_SE] == pytest.approx(0.1)
    assert alpha == pytest.approx(trust_alpha(0.5, 0.2, 0.7, 0.01, 0.1, 1.0)) and ALPHA == "alpha"


def test_client_alpha_refuses_scores_it_cannot_pair():
    """One context has no standard error; contexts of unequal count are not the same contexts."""
    schedule = {"k": 0.7, "midpoint": 0.01, "alpha_min": 0.1, "alpha_max": 1.0}
    for scores in (
        {"local": [0.2], "global": [0.5]},
        {"local": [0.2, 0.3], "global": [0.5, 0.4, 0.6]},
    ):
        with pytest.raises(ValueError, match="same 2\\+ contexts"):
            client_alpha(schedule, scores.__getitem__)


def test_relative_distance_by_hand():
    reference = {
        "a": np.array([3.0, 0.0], np.float32),
        "b": np.array([[4.0]], np.float32),
    }  # norm 5
    moved = {
        "a": np.array([3.0, 3.0], np.float32),
        "b": np.array([[0.0]], np.float32),
    }  # diff (0, 3, -4)
    assert relative_distance(moved, reference) == pytest.approx(1.0)
    assert relative_distance(reference, reference) == 0.0
    assert relative_distance(mix(moved, reference, 0.75), reference) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="keys"):
        relative_distance({"a": np.zeros(2)}, {"b": np.zeros(2)})
