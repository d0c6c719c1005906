"""Run outputs: resolved config, results.json, a markdown summary, plots and errors."""

from __future__ import annotations

import base64
import gzip
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import unicodedata
import zlib
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf/NaN; null means "unbounded" (e.g. epsilon at sigma = 0)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _jsonable(value.item())
    return value


def create_new(path: Path, mode: int = 0o666) -> int:
    """A descriptor open for writing on a new file at ``path`` (``mode`` less the umask): refused
    when the name exists, as a link too (O_EXCL | O_NOFOLLOW), so nothing planted there is
    written through."""
    return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, mode)


@contextmanager
def replacing(path: str | Path):
    """A binary file whose contents become ``path`` when the block ends: a new file in the same
    folder (:func:`create_new`), synced, then renamed over the name. A rename replaces a link
    planted at the name, it never writes through it, and a reader never sees half a file; on an
    error the name keeps what it held. How fedsim writes every file into a results folder (a
    record shared as files may hold links). By hand: ``tempfile.mkstemp`` makes its file 0600,
    and a result keeps the user's umask."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        with os.fdopen(create_new(tmp), "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_file(path: str | Path, data: str | bytes) -> Path:
    """``data`` (text as UTF-8) as the file ``path``, through :func:`replacing`."""
    with replacing(path) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


RESULTS_MARKER = "FEDSIM-RESULTS "
CHUNK_CHARS = 4096
MAX_FILE_BYTES = 32 << 20  # one shipped file, decoded
MAX_SHIPMENT_BYTES = 128 << 20  # the whole shipment, decompressed (a gzip bomb stops here)
# What a shipment may hold: flat result files, and TensorBoard's event files. Never checkpoint/
# (a planted run.json or journal entry would be trusted by a later resume), never a path.
SHIPPABLE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_-]{0,100}\.(json|md|yaml|csv|txt|png)"
    r"|\.hydra/(config|overrides|hydra)\.yaml"
    r"|tensorboard/events\.out\.tfevents\.[A-Za-z0-9_-][A-Za-z0-9_.-]{0,150}"
)


class ShipmentRefused(ValueError):
    """A remote run's results are malformed or hold something they may not: the run failed."""


def _shippable(folder: Path) -> dict[str, bytes]:
    """The files of ``folder`` a shipment may carry, by their relative names."""
    paths = [
        *folder.iterdir(),
        *(
            p
            for sub in ("tensorboard", ".hydra")
            if (folder / sub).is_dir()
            for p in (folder / sub).glob("*")
        ),
    ]
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(paths)
        if p.is_file()
        and not p.is_symlink()
        and SHIPPABLE.fullmatch(p.relative_to(folder).as_posix())
    }


def ship_results(folder: Path) -> list[str]:
    """The folder's result files as log lines (gzip'd JSON of name -> base64 contents, base64,
    numbered chunks): how the results of a run on a remote SuperLink reach the user's machine
    through the run's log stream, without shell access to the SuperLink host (Flower's
    ``flwr pull`` needs an artifact store a self-hosted SuperLink does not have). A map of flat
    names, not a tar: the receiver writes only names it allows, never links or paths."""
    files = {name: base64.b64encode(data).decode() for name, data in _shippable(folder).items()}
    text = base64.b64encode(gzip.compress(json.dumps(files).encode())).decode()
    chunks = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
    return [f"{RESULTS_MARKER}{i}/{len(chunks)} {chunk}" for i, chunk in enumerate(chunks)]


def _joined(lines: list[str]) -> bytes:
    """The shipment's bytes from its numbered chunks; refuse a missing or inconsistent one."""
    chunks, totals = {}, set()
    for line in lines:
        head, _, chunk = line[len(RESULTS_MARKER) :].partition(" ")
        index, total = map(int, head.split("/"))
        chunks[index] = chunk.strip()
        totals.add(total)
    if len(totals) != 1 or sorted(chunks) != list(range(totals.pop())):
        raise ShipmentRefused(f"results arrived incomplete: {len(chunks)} chunks, totals {totals}")
    return base64.b64decode("".join(chunks[i] for i in range(len(chunks))), validate=True)


def _inflate(data: bytes) -> bytes:
    """gunzip at most MAX_SHIPMENT_BYTES: a small shipment cannot fill the disk or the memory."""
    inflater = zlib.decompressobj(wbits=31)
    out = inflater.decompress(data, MAX_SHIPMENT_BYTES + 1)
    if len(out) > MAX_SHIPMENT_BYTES or inflater.unconsumed_tail:
        raise ShipmentRefused(f"results exceed {MAX_SHIPMENT_BYTES} bytes decompressed")
    return out


def decode_shipment(lines: list[str]) -> dict[str, bytes]:
    """Name -> contents of a shipment, every name allowed and every file within its cap."""
    files = json.loads(_inflate(_joined(lines)))
    if not isinstance(files, dict):
        raise ShipmentRefused("results are not a map of file names")
    decoded = {}
    for name, text in files.items():
        if not SHIPPABLE.fullmatch(name) or not isinstance(text, str):
            raise ShipmentRefused(f"results hold a name that is not allowed: {name!r}")
        if len(text) > MAX_FILE_BYTES * 4 // 3 + 4:
            raise ShipmentRefused(f"{name!r} exceeds {MAX_FILE_BYTES} bytes")
        decoded[name] = base64.b64decode(text, validate=True)
    return decoded


def _write_new(folder: Path, name: str, data: bytes) -> None:
    """A new file (never an existing one, never through a link) under ``folder``."""
    path = folder / name
    if "/" in name:
        path.parent.mkdir(mode=0o700, exist_ok=True)
    with os.fdopen(create_new(path, 0o644), "wb") as fh:
        fh.write(data)


def unpack_results(lines: list[str], folder: Path) -> Path:
    """Write what :func:`ship_results` sent into a new folder of its own under ``folder``, then
    move each file into ``folder`` (a rename replaces a name, it does not follow it). Any
    malformed, oversized or not-allowed content refuses the whole shipment (ShipmentRefused)."""
    try:
        files = decode_shipment(lines)
    except ShipmentRefused:
        raise
    except (ValueError, TypeError, KeyError, zlib.error, EOFError, RecursionError) as exc:
        raise ShipmentRefused(f"results could not be decoded: {type(exc).__name__}: {exc}") from exc
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".shipment-", dir=folder))
    try:
        for name, data in files.items():
            _write_new(staging, name, data)
        for sub in {name.split("/")[0] for name in files if "/" in name}:
            if (folder / sub).is_symlink():
                raise ShipmentRefused(f"{folder / sub} is a link; results not written")
            (folder / sub).mkdir(exist_ok=True)
        for name in files:
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


class RunOutput:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def clear_outcome(self) -> None:
        """A resumed run starts without the killed run's outcome files."""
        for name in ("results.json", "summary.md", "error.txt"):
            (self.path / name).unlink(missing_ok=True)

    def write_config(self, cfg: DictConfig, overrides: list[str], hydra: DictConfig) -> None:
        """``config.yaml``, and Hydra's own record of the run where a Hydra user looks for it:
        ``.hydra/config.yaml``, ``.hydra/overrides.yaml`` and ``.hydra/hydra.yaml``."""
        config = OmegaConf.to_yaml(cfg, resolve=True)
        write_file(self.path / "config.yaml", config)
        record = self.path / ".hydra"
        if record.is_symlink():  # a record's, planted: its files would go where it points
            record.unlink()
        record.mkdir(exist_ok=True)
        write_file(record / "config.yaml", config)
        write_file(record / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
        write_file(record / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra})))

    def write_results(self, results: dict, summary_md: str) -> None:
        write_file(self.path / "results.json", json.dumps(_jsonable(results), indent=2))
        write_file(self.path / "summary.md", summary_md)

    def files(self) -> list[Path]:
        """The run's result files: config, results, summary, plots (what a tracker keeps)."""
        return sorted(
            p
            for p in self.path.iterdir()
            if p.is_file() and p.suffix in (".json", ".md", ".yaml", ".png")
        )

    def write_error(self, text: str) -> None:
        write_file(self.path / "error.txt", text)

    def figure(self, name: str):
        """Context-free helper: a new figure whose ``save()`` writes ``<name>.png`` here."""
        fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
        return fig, ax, self._saving(fig, name)

    def panels(self, name: str, rows: list[int]):
        """A figure of one panel per entry of ``rows`` (its row count sets its height), stacked,
        each with its own x axis: a figure with one unit per axis. ``save()`` as :meth:`figure`."""
        fig, axes = plt.subplots(
            len(rows),
            1,
            figsize=(7, 1.0 + 1.0 * len(rows) + 0.22 * sum(rows)),
            dpi=120,
            squeeze=False,
            gridspec_kw={"height_ratios": [r + 2 for r in rows]},
            layout="constrained",  # room for the title and a legend outside the panels
        )
        return fig, list(axes[:, 0]), self._saving(fig, name)

    def _saving(self, fig, name: str):
        """``save()``: lay out, write ``<name>.png`` here, close the figure."""
        path = self.path / f"{name}.png"

        def save():
            if fig.get_layout_engine() is None:
                fig.tight_layout()
            with replacing(path) as fh:
                fig.savefig(fh, format="png")
            plt.close(fig)
            return path

        return save


def plain_log_scale(ax, which: str = "y") -> None:
    """``ax``'s ``which`` axis on a log scale labelled in plain numbers ("2", "30", not
    "2x10^0"), its minor ticks labelled only where it spans few decades (matplotlib's rule)."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(LogFormatter())
    axis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))


def escape_controls(text, keep: str = "") -> str:
    """``text`` with its control characters (newline, CR, tab, ANSI's ESC, the rest of C0 and C1,
    Unicode's line and paragraph separators, format characters such as bidi overrides, lone
    surrogates) as their Python escapes, but those in ``keep``. A record's names (metrics,
    methods, overrides, folders) are someone else's: a terminal obeys an ANSI escape in one
    (clears the screen, retitles the window, on some terminals writes the clipboard)."""
    return "".join(
        c.encode("unicode_escape").decode()
        if c not in keep and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        else c
        for c in str(text)
    )


def markdown_text(text) -> str:
    """``text`` as markdown that starts no line and adds no table cell: control characters as
    :func:`escape_controls` writes them, ``|`` and ``\\`` as ``\\|`` and ``\\\\`` (a name's own
    ``\\|`` would otherwise become ``\\\\|``: an escaped backslash, then the cell's end for
    Python-Markdown). A metric name holding a newline put a line of its own into the summary."""
    return "".join("\\" + c if c in "\\|" else escape_controls(c) for c in str(text))


def number_text(value: float, digits: int = 4, sign: bool = False) -> str:
    """``value`` with ``digits`` decimals, or, when it is not 0 and under the last decimal's unit
    (a delta of 1e-5 printed as 0.0000), in ``digits - 1`` significant digits, scientific where
    small (``1e-05``, ``1.98e-05``). ``sign``: a ``+`` before a positive number."""
    plus = "+" if sign else ""
    if value != 0 and math.isfinite(value) and abs(value) < 10.0**-digits:
        return f"{value:{plus}.{max(digits - 1, 1)}g}"
    return f"{value:{plus}.{digits}f}"


def markdown_table(rows: list[dict], columns: list[str], digits: int = 4) -> str:
    """A markdown table of ``rows``' ``columns``, every cell and header through :func:`markdown_text`,
    floats through :func:`number_text`."""

    def fmt(v):
        if v is None:
            return "inf"
        return markdown_text(number_text(v, digits) if isinstance(v, float) else v)

    lines = ["| " + " | ".join(map(markdown_text, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r[c]) if c in r else "" for c in columns) + " |" for r in rows]
    return "\n".join(lines)
