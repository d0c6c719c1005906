"""FedDTRE's trust-weighted mixing of global and local weights (METHODS.md section 2).

Shared by the strategy that sends the schedule (``fedsim_strategies/trust_alpha.py``) and the client
that mixes (``fedsim_clients/dialogue.py``), which may not import each other.

With trust scores s_g (global model) and s_l (local model) on the same contexts, delta = s_g - s_l
and sig(x) = 1 / (1 + exp(-k (x - midpoint))):
phi = 0 if delta <= 0 else (sig(delta) - sig(0)) / (sig(1) - sig(0)), clipped to [0, 1];
alpha = alpha_min + phi (alpha_max - alpha_min); the client sends W = (1 - alpha) W_local + alpha W_global.
A global model more trusted than the local one pulls the client back towards it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import sem


def trust_phi(delta: float, k: float, midpoint: float) -> float:
    """The share of the way from alpha_min to alpha_max that a trust gain ``delta`` earns."""
    if not math.isfinite(delta):
        raise ValueError(f"delta must be finite, got {delta}")
    if delta <= 0:
        return 0.0

    def sig(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-k * (x - midpoint)))

    return min(max((sig(delta) - sig(0.0)) / (sig(1.0) - sig(0.0)), 0.0), 1.0)


def trust_alpha(
    s_global: float, s_local: float, k: float, midpoint: float, alpha_min: float, alpha_max: float
) -> float:
    """The weight of the global model in the client's mix."""
    if not 0.0 <= alpha_min <= alpha_max <= 1.0:
        raise ValueError(f"need 0 <= alpha_min <= alpha_max <= 1, got {alpha_min}, {alpha_max}")
    return alpha_min + trust_phi(s_global - s_local, k, midpoint) * (alpha_max - alpha_min)


def mix(
    local: dict[str, np.ndarray], global_: dict[str, np.ndarray], alpha: float
) -> dict[str, np.ndarray]:
    """W = (1 - alpha) W_local + alpha W_global, key by key (same keys and shapes required)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if local.keys() != global_.keys():
        raise ValueError(
            f"local and global weights differ in keys: {sorted(set(local) ^ set(global_))[:3]}"
        )
    out = {}
    for key, w in local.items():
        if np.shape(w) != np.shape(global_[key]):
            raise ValueError(f"{key}: local shape {np.shape(w)} != global {np.shape(global_[key])}")
        out[key] = ((1.0 - alpha) * w + alpha * global_[key]).astype(w.dtype)
    return out


def relative_distance(weights: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """||weights - reference|| / ||reference|| over every array (float64): how far a client's own
    model has moved from the global one, one number a client may report without its weights
    (0: the global model itself)."""
    if weights.keys() != reference.keys():
        raise ValueError(f"weights differ in keys: {sorted(set(weights) ^ set(reference))[:3]}")
    diff = sum(
        float(np.sum((np.asarray(w, np.float64) - np.asarray(reference[k], np.float64)) ** 2))
        for k, w in weights.items()
    )
    norm = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in reference.values())
    return float(np.sqrt(diff / norm)) if norm > 0 else float(np.sqrt(diff))


# Message keys of the mixing, defined once for the strategy and the clients.
MIXING = (
    "mixing"  # config (train): JSON {"k", "midpoint", "alpha_min", "alpha_max"} or {"fixed_alpha"}
)
ALPHA = "alpha"  # metrics (reply): the client's alpha this round
S_LOCAL = "s-local"  # metrics (reply): trust score of the local model (trust mixing only)
S_GLOBAL = "s-global"  # metrics (reply): trust score of the global model (trust mixing only)
S_GAP_SE = "s-gap-se"  # metrics (reply): standard error of s_g - s_l over the scoring contexts (trust mixing only)
SCORED = (
    "scored-contexts"  # metrics (reply): contexts both models were scored on (trust mixing only)
)
TRAIN_NLL = (
    "train-nll"  # metrics (reply, mixing): the local model's nll per token on its training replies
)
HELDOUT_NLL = (
    "heldout-nll"  # metrics (reply, mixing): ... on its held-out replies (the gap: its overfitting)
)
RECORDED = (
    ALPHA,
    S_LOCAL,
    S_GLOBAL,
    S_GAP_SE,
    SCORED,
    TRAIN_NLL,
    HELDOUT_NLL,
)  # what the server keeps per client


def client_alpha(mixing: dict, score: callable) -> tuple[float, dict]:
    """The alpha a client uses under ``mixing`` (the strategy's message), and what it reports.
    ``score(which)`` gives the trust scores of the "local" or "global" model's replies, one per
    scoring context (the same contexts for both); it is called only under trust mixing (fixed
    alphas need no evaluation). s_g - s_l is a paired mean: its standard error comes from the
    per-context differences (scipy.stats.sem), so a reader sees whether alpha follows a signal
    or the noise of the sample."""
    if "fixed_alpha" in mixing:
        return float(mixing["fixed_alpha"]), {}
    local, global_ = np.asarray(score("local"), np.float64), np.asarray(score("global"), np.float64)
    if local.shape != global_.shape or local.size < 2:
        raise ValueError(
            f"trust scores of both models on the same 2+ contexts needed, got {local.size} "
            f"and {global_.size}"
        )
    s_local, s_global = float(local.mean()), float(global_.mean())
    alpha = trust_alpha(
        s_global, s_local, mixing["k"], mixing["midpoint"], mixing["alpha_min"], mixing["alpha_max"]
    )
    return alpha, {
        S_LOCAL: s_local,
        S_GLOBAL: s_global,
        S_GAP_SE: float(sem(global_ - local)),
        SCORED: float(local.size),
    }
