"""FedTP's paired analysis of FedMix against TF-IDF: its interval resamples conversations."""

import numpy as np

from fedsim.results.stats import cluster_mean_ci, paired_bootstrap_ci
from fedsim_experiments.fedtp.protocol import _paired_analyses


def _turns(conversations: int, per: int) -> dict:
    """Conversations whose turns all gain or all lose together (a conversation's prior and
    candidates decide them), the gains a little more often: correlated turns."""
    rng = np.random.default_rng(7)
    row = np.repeat(np.arange(conversations), per)
    gains = rng.random(conversations) < 0.55
    gold = np.zeros(row.size, int)
    return {
        "row": row,
        "gold": gold,
        "ambiguous": np.zeros(row.size, bool),
        "pick/tfidf": np.where(gains[row], 1, 0),
        "pick/fedmix": np.where(gains[row], 0, 1),
        "pick/global": np.where(row % 2, 0, 1),
    }


def test_the_ehr_gain_interval_resamples_conversations_and_names_them():
    turns = _turns(40, 25)
    analyses, gains = _paired_analyses(turns, "conversation", 2000, seed=0)
    diff = (turns["pick/fedmix"] == 0).astype(float) - (turns["pick/tfidf"] == 0)
    assert analyses["bootstrap_ci_ehr_gain_unit"] == {"unit": "conversation", "clusters": 40}
    assert analyses["bootstrap_ci_ehr_gain"] == list(cluster_mean_ci(diff, turns["row"], 2000, 0))
    lo, hi = analyses["bootstrap_ci_ehr_gain"]
    item_lo, item_hi = paired_bootstrap_ci(diff, 2000, 0)  # 1,000 turns taken as independent
    assert hi - lo > 3 * (item_hi - item_lo)


def test_the_ablation_against_the_global_prior_resamples_the_same_conversations():
    """FedMix against the global prior alone: its gain and interval over conversations, as the
    headline's (the routers decide turns of one conversation together)."""
    turns = _turns(40, 25)
    analyses, _ = _paired_analyses(turns, "conversation", 2000, seed=0)
    diff = (turns["pick/fedmix"] == 0).astype(float) - (turns["pick/global"] == 0)
    assert analyses["ehr_gain_over_global"] == diff.mean()
    assert analyses["bootstrap_ci_ehr_gain_over_global"] == list(
        cluster_mean_ci(diff, turns["row"], 2000, 0)
    )
