"""The ``task`` block of HH-RLHF preference pairs, typed (``conf/task/hh_rlhf.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import TaskSettings

MINORITY_KINDS = ("reversed", "second_criterion", "rules")
POPULATIONS = ("majority", "minority")
CRITERIA = ("longer", "shorter")


@dataclass(frozen=True, kw_only=True)
class MinorityPreference:
    """What the minority clients prefer (``task.minority_preference``): HH's label reversed, or
    HH's label where an HH probe backs it and a second criterion (response length) where the
    probe finds it weak: a preference that weighs differently without opposing HH."""

    kind: str  # reversed | second_criterion | rules (each population's rule: ``task.rules``)
    prefer: str  # second_criterion: longer | shorter (words) on the weak pairs
    weak_share: (
        float  # second_criterion: share of pairs, least backed by the HH probe, decided by `prefer`
    )

    def __post_init__(self):
        if self.kind not in MINORITY_KINDS:
            raise ValueError(
                f"task.minority_preference.kind={self.kind!r} is not one of {MINORITY_KINDS}"
            )
        if self.prefer not in CRITERIA:
            raise ValueError(
                f"task.minority_preference.prefer={self.prefer!r} is not one of {CRITERIA}"
            )
        if not 0.0 < self.weak_share <= 1.0:
            raise ValueError(
                f"task.minority_preference.weak_share must be in (0, 1], got {self.weak_share}"
            )


@dataclass(frozen=True, kw_only=True)
class HHRLHFSettings(TaskSettings):
    units = ("prompt",)  # the policies are compared on held-out prompts, no client's
    selector: dict
    """the selector entry (``conf/task/selector/*.yaml``: its ``_target_`` and settings)"""
    seed: int
    max_pairs: int | None
    splits: dict[str, int]
    split_seed: int
    topic_model: str
    n_topics: int
    partitioner: dict
    valid_share: float
    minority_share: float
    minority_preference: MinorityPreference
    judge: dict
    rules: dict | None
    """population -> its preference rule's entry (``_target_``, issue 63): the majority's and the
    minority's labels both come from their rules, ties dropped; null: HH's label and
    ``minority_preference``"""

    def __post_init__(self):
        super().__post_init__()
        ruled = self.minority_preference.kind == "rules"
        if ruled != (self.rules is not None):
            raise ValueError(
                "task.minority_preference.kind=rules and task.rules go together: set both "
                f"(got kind={self.minority_preference.kind!r}, rules={self.rules!r})"
            )
        if self.rules is not None and (
            sorted(self.rules) != sorted(POPULATIONS)
            or not all(isinstance(v, dict) and "_target_" in v for v in self.rules.values())
        ):
            raise ValueError(
                f"task.rules must name a rule (a _target_) for each of {POPULATIONS}, got "
                f"{self.rules!r}"
            )
