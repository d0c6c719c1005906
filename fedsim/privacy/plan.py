"""The run's privacy plan: who draws what noise, what is spent, and whether HE is on.

The ServerApp builds one :class:`PrivacyPlan` per run from the config and the run's secret
(``fedsim/privacy/secret.py``) and hands it to the protocol, which passes it to every strategy it
builds (``fedsim_experiments/common.py`` ``build_strategy``). The plan owns:

- the noise: one :class:`~fedsim.privacy.dp.NoiseSource` per run, keyed from the secret (or the
  public seed under ``privacy.reproducible_noise``), whose streams are named by the labels in
  ``fedsim/privacy/dp.py`` (a release, a sweep point, a round's sample, Flower's wrappers, an
  audit's coins); a strategy that draws noise of its own takes it at construction
  (:meth:`PrivacyPlan.strategy_args`), and an audit's attacker redraws a release's noise from the
  public seed through :meth:`PrivacyPlan.seed_noise`, never by a recipe of its own;
- the accounts: central DP (:class:`CentralLedger`: every Flower DP wrapper of the run spends from
  one account at ``privacy.delta``) and the clients' DP-SGD epsilons (:class:`DPSGDLedger`, fed
  by the Messenger with every exchange's usable replies);
- the HE switch: whether the strategy slot runs inside HEFedAvg (``privacy=he_fedavg``), and
  HEFedAvg's one entry (``conf/privacy/he_fedavg.yaml``, the task's CKKS parameters), from which
  a method that asks HE for itself composes its wrapper (:meth:`PrivacyPlan.he_wrapper`).

The Messenger carries traffic and faults only: it holds none of this.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import MetricRecord
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR
from fedsim.message_keys import DP_EPSILON, DP_EPSILON_PLD, DP_EPSILON_RDP
from fedsim.privacy.dp import NOT_PRIVATE, CentralDP, NoiseSource, Release, gaussian_noise
from fedsim.privacy.secret import derive, run_secret

HE_ENTRY = (
    CONF_DIR / "privacy" / "he_fedavg.yaml"
)  # HEFedAvg's one entry, for the slot and a method alike
CKKS_KEYS = (
    "poly_modulus_degree",
    "coeff_mod_bit_sizes",
)  # the task's CKKS parameters HEFedAvg holds replies to


class CentralLedger:
    """The run's one central-DP account, opened by the first DP wrapper built: every later one
    (another phase, another model) spends from it, so the run's epsilon composes them all."""

    def __init__(self):
        self.account: CentralDP | None = None

    def open(self, account: CentralDP) -> CentralDP:
        """The open account; ``account`` (a wrapper's, empty) where none is open yet. A wrapper
        of another mechanism, multiplier or delta is refused: its releases spent at the open
        account's rate would report the wrong epsilon."""
        self.account = self.account or account
        opened = (self.account.mechanism, self.account.noise_multiplier, self.account.delta)
        if (account.mechanism, account.noise_multiplier, account.delta) != opened:
            raise ValueError(
                f"a second DP wrapper ({account.mechanism}, sigma {account.noise_multiplier}, "
                f"delta {account.delta}) in a run whose central account is {opened}: one "
                f"run, one DP mechanism"
            )
        return self.account


class DPSGDLedger:
    """Each client's DP-SGD epsilon (``fedsim_tasks/dp_sgd.py``) per phase and round, as its
    replies carry it (the reported one and, beside it, by RDP and by PLD)."""

    def __init__(self):
        self.epsilon: dict[
            str, dict[int, dict[int, float]]
        ] = {}  # phase -> round -> node -> epsilon
        self.epsilon_rdp: dict[str, dict[int, dict[int, float]]] = {}
        self.epsilon_pld: dict[str, dict[int, dict[int, float]]] = {}

    def record(self, phase: str, server_round: int, replies: list) -> dict:
        """Keep the replies' epsilons; the sink row's column, their max: it is per client, and a
        mean over clients hides the largest."""

        def by_node(key: str) -> dict[int, float]:
            return {
                m.metadata.src_node_id: float(r[key])
                for m in replies
                for r in m.content.values()  # its metric records (not Flower's checked dict of them)
                if isinstance(r, MetricRecord) and isinstance(r.get(key), (int, float))
            }

        spent = by_node(DP_EPSILON)
        if not spent:
            return {}
        self.epsilon.setdefault(phase, {})[server_round] = spent
        for kept, key in ((self.epsilon_rdp, DP_EPSILON_RDP), (self.epsilon_pld, DP_EPSILON_PLD)):
            if by_accountant := by_node(key):
                kept.setdefault(phase, {})[server_round] = by_accountant
        return {f"metric/{DP_EPSILON}-max": max(spent.values())}

    def report(self) -> dict:
        return {
            key: kept
            for key, kept in (
                ("dp_sgd_epsilon", self.epsilon),
                ("dp_sgd_epsilon_rdp", self.epsilon_rdp),
                ("dp_sgd_epsilon_pld", self.epsilon_pld),
            )
            if kept
        }


@dataclass(frozen=True)
class PrivacyPlan:
    """The run's privacy, decided once (module docstring). Its accounts fill as the run spends."""

    noise: NoiseSource  # the run's DP noise and DP sampling
    seed: int  # the public seed: what an audit's attacker knows
    delta: float | None = None  # privacy.delta: central DP's (epsilon, delta)
    audit_canaries: int = 0  # canary clients a strategy's audited release adds (0: no audit)
    he: bool = False  # the strategy slot runs inside HEFedAvg (privacy=he_fedavg)
    he_entry: dict | None = (
        None  # HEFedAvg's entry with the task's CKKS parameters (None: the task has none)
    )
    central: CentralLedger = field(default_factory=CentralLedger)
    dp_sgd: DPSGDLedger = field(default_factory=DPSGDLedger)

    @classmethod
    def build(cls, cfg, secret: bytes) -> PrivacyPlan:
        """The run's plan from its config and secret. The noise is keyed from the secret, or
        (asked for, in simulation or a deployment on this machine: ``tests/test_e2e_parity.py``
        compares the two) drawn from the public seed, which makes every release reproducible and
        therefore not private."""
        privacy = cfg.privacy
        he = privacy.kind == "he"
        ckks = (cfg.get("task") or {}).get("he")
        entry = None
        if ckks:
            wrapper = privacy.wrapper if he else OmegaConf.load(HE_ENTRY).wrapper
            entry = {
                **OmegaConf.to_container(wrapper, resolve=True),
                **{k: ckks[k] for k in CKKS_KEYS},
            }
        audit = privacy.get("audit")
        return cls(
            noise_source(cfg, secret),
            int(cfg.seed),
            privacy.delta,
            int(audit.canaries) if audit and audit.enabled else 0,
            he,
            entry,
        )

    @classmethod
    def fresh(cls, cfg) -> PrivacyPlan:
        """A plan under a secret of its own: a protocol driven without the ServerApp (tests)."""
        return cls.build(cfg, run_secret(None, resume=False))

    def strategy_args(self, parameters: Iterable[str]) -> dict:
        """What a strategy that draws noise of its own takes at construction, of its ``parameters``:
        the run's ``noise`` and an audit's ``audit_canaries`` (``DPMean``)."""
        given = {"noise": self.noise, "audit_canaries": self.audit_canaries}
        return {name: given[name] for name in parameters if name in given}

    def he_wrapper(self, **settings) -> dict:
        """HEFedAvg's entry from its one YAML with the task's CKKS parameters, and ``settings``
        (a method's own: ``chunk_floats``, ``one_trip``)."""
        if self.he_entry is None:
            raise ValueError("HE needs the task's CKKS parameters (task.he); this task has none")
        return {**self.he_entry, **settings}

    def seed_noise(self, release: Release) -> np.ndarray:
        """``release``'s noise as an attacker who knows only the public seed redraws it (the
        release's own stream under ``privacy.reproducible_noise``; else a guess that misses)."""
        return gaussian_noise(
            NoiseSource.public(self.seed).rng(*release.labels),
            release.noise_std,
            len(release.noised),
        )

    def report(self) -> dict:
        """results.json's ``privacy``: whether the DP noise was private, each client's DP-SGD
        epsilon per round for replacing one record (``dp_sgd_epsilon``, the smaller of
        ``dp_sgd_epsilon_rdp`` and ``dp_sgd_epsilon_pld``), and what Flower's DP wrappers spent
        (``central_dp``, ``fedsim/privacy/dp.py``)."""
        central = self.central.account
        return {
            "private_noise": self.noise.private,
            **({} if self.noise.private else {"warning": NOT_PRIVATE}),
            **self.dp_sgd.report(),
            **({"central_dp": central.report()} if central else {}),
        }


def noise_source(cfg, secret: bytes) -> NoiseSource:
    """The run's DP noise: a key derived from the run's secret, or the public seed where the run
    asked for reproducible noise (refused for a remote SuperLink)."""
    if not cfg.privacy.reproducible_noise:
        return NoiseSource.from_key(derive(secret, b"dp-noise"))
    if cfg.hardware.backend != "simulation" and not cfg.hardware.launch_local:
        raise ValueError("privacy.reproducible_noise=true is refused for a remote SuperLink")
    logging.getLogger("fedsim").warning("%s", NOT_PRIVATE)
    return NoiseSource.public(int(cfg.seed))
