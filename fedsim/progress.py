"""Progress of long waits with count, rate and time left, as tqdm computes and shows them.

The ServerApp's output is a log (the run's stream, ``flwr log``, a sweep point's ``fedsim.log``),
so it writes plain lines, each formatted by tqdm's meter (:func:`line`). Where that stream reaches
a terminal (``fedsim run`` in a shell), the launcher draws each phase's lines as one live tqdm bar
instead (:class:`Bars`); anywhere else it passes them on as they are."""

from __future__ import annotations

import re
import sys

from tqdm import tqdm

FORMAT = "{desc} {n_fmt}/{total_fmt} {unit} done [{elapsed}<{remaining}, {rate_fmt}]{postfix}"
LINE = re.compile(
    r"\[(?P<phase>[^\]]+)\] (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+) done \[[^\]]*\]"
    r"(?:, (?P<note>.*))?$"
)


def line(
    phase: str, done: int, total: int, elapsed: float, unit: str = "clients", note: str = ""
) -> str:
    """``[phase] done/total unit done [elapsed<left, rate]``, and ``note`` after a comma."""
    return tqdm.format_meter(
        done,
        total,
        elapsed,
        prefix=f"[{phase}]",
        unit=unit,
        bar_format=FORMAT,
        postfix=note or None,
    )


class Bars:
    """An echo for the run's stream: on a terminal, progress lines (:data:`LINE`) become one
    tqdm bar per phase, closed when any other line is printed; off a terminal, plain lines."""

    def __init__(self, echo=print, stream=None):
        self.echo, self.stream = echo, stream or sys.stderr
        self.live, self.bar, self.key = self.stream.isatty(), None, None

    def __call__(self, text: str) -> None:
        found = LINE.search(text) if self.live else None
        if found is None:
            self.close()
            self.echo(text)
            return
        done, key = int(found["done"]), (found["phase"], found["unit"], int(found["total"]))
        if key != self.key:
            self.close()
            self.bar = tqdm(
                total=key[2],
                initial=done,
                desc=f"[{key[0]}]",
                unit=key[1],
                file=self.stream,
                dynamic_ncols=True,
            )
            self.key = key
        self.bar.update(done - self.bar.n)
        if found["note"]:
            self.bar.set_postfix_str(found["note"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar, self.key = None, None

    def __enter__(self) -> Bars:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


LOG_LEVELS = ("debug", "info")  # logging.level: debug shows the lines of NOISE too
# Lines every run prints that say nothing about it: Flower's dump of a strategy's ConfigRecords (the
# whole task config, ~1,000 characters), its warning about a default the run does not use (fedsim
# sizes the federation), its warning that federated evaluation is skipped (fedsim evaluates on
# the server or in its own exchanges), and Ray's tip about a variable fedsim does not set (with its source line).
NOISE = re.compile(
    r"ConfigRecord \((train|evaluate)\): "
    r"|Since flwr 1\.32, default simulated SuperNodes changed"
    r"|To change federation size, use the following command"
    r"|flwr federation simulation-config "
    r"|fraction_evaluate is set to 0\.0\. Federated evaluation will be skipped"
    r"|FutureWarning: Tip: In future versions of Ray"
    r"|^\s*warnings\.warn\($"
)


def is_noise(text: str) -> bool:
    """Whether a log line is one of :data:`NOISE`, shown at ``logging.level=debug`` only."""
    return NOISE.search(text) is not None


class Quiet:
    """A filter for Flower's logger: a record of :data:`NOISE` is dropped (``logging.level=info``).
    Flower logs it at INFO or WARNING itself, and has no setting for either."""

    def filter(self, record) -> bool:
        return not is_noise(record.getMessage())
