"""A round-based run's learning curve (``learning_curve.png``): each per-round metric its
results.json holds, against the round, one line per method. Found by the shape experiments
record rounds in, so every round-based experiment gets one: a ``curve`` list of ``{"round": r,
metric: value}`` (turn_sentiment), or a path with a ``rounds`` component followed by the round
number (``methods.<m>.rounds.<r>.<metric>``, ``rounds.<m>.<dataset>.<r>.<metric>``)."""

from __future__ import annotations

from matplotlib.ticker import MaxNLocator

from fedsim.results.display import MEASURES, axis_label, measure
from fedsim.results.outputs import RunOutput

MAX_PANELS = 4  # measures per figure: LEAD's, then in the order of fedsim.results.display.MEASURES
LEAD = ("accuracy", "loss", "train-loss")  # the panels first, then MEASURES' order
FONT = 8  # ticks and legend, points at the saved size


def _flat(results, prefix=()):
    """(path components, value) of every number in ``results`` (list items by index)."""
    if isinstance(results, bool):
        return
    if isinstance(results, (int, float)):
        yield prefix, float(results)
    elif isinstance(results, dict):
        for key, value in results.items():
            yield from _flat(value, (*prefix, str(key)))
    elif isinstance(results, list):
        for i, value in enumerate(results):
            yield from _flat(value, (*prefix, str(i)))


def per_round(results: dict) -> dict[str, dict[str, dict[int, float]]]:
    """measure -> series (the method, "" for the run's own) -> round -> value, for every
    measure recorded over two rounds or more that is not a count (seconds, bytes)."""
    found: dict[str, dict[str, dict[int, float]]] = {}
    for point in results.get("curve") or []:
        if isinstance(point, dict) and isinstance(point.get("round"), int):
            for key, value in point.items():
                if key != "round" and isinstance(value, (int, float)):
                    found.setdefault(key, {}).setdefault("", {})[point["round"]] = float(value)
    for parts, value in _flat({k: v for k, v in results.items() if k != "curve"}):
        if "rounds" not in parts:
            continue
        at = parts.index("rounds")
        digit = next((i for i in range(at + 1, len(parts)) if parts[i].isdigit()), None)
        if digit is None or digit == len(parts) - 1:
            continue
        series = ".".join(p for p in parts[:digit] if p not in ("rounds", "methods"))
        name = ".".join(parts[digit + 1 :])
        found.setdefault(name, {}).setdefault(series, {})[int(parts[digit])] = value
    order = [*LEAD, *MEASURES]
    return {
        m: series
        for m, series in sorted(
            found.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)
        )
        if m in MEASURES
        and not measure(m).count
        and any(len(rounds) >= 2 for rounds in series.values())
    }


def learning_curve(results: dict, out: RunOutput, title: str):
    """``learning_curve.png``, titled ``title`` (the experiment): the first :data:`MAX_PANELS`
    measures of :func:`per_round`, one panel each; None (no file) for a run that records no
    round. Returns the figure."""
    curves = dict(list(per_round(results).items())[:MAX_PANELS])
    if not curves:
        return None
    fig, axes, save = out.panels("learning_curve", [6] * len(curves))
    for ax, (name, series) in zip(axes, curves.items()):
        for label, rounds in sorted(series.items()):
            x = sorted(rounds)
            ax.plot(x, [rounds[r] for r in x], marker="o", ms=3, label=label or name)
        ax.set_title(f"{measure(name).name} per round", fontsize=FONT + 2)
        ax.set_xlabel("round", fontsize=FONT + 1)
        ax.set_ylabel(axis_label(name), fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=FONT)
    fig.suptitle(f"Learning curve: {title}", fontsize=FONT + 3)
    save()
    return fig
