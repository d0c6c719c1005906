"""A remote run's results come back through a log the remote operator controls: a crafted
shipment must not write outside the results folder, plant a checkpoint (a later resume would
trust it), follow a link, or fill the disk. Each crafted shipment is refused as a whole."""

import base64
import gzip
import io
import json
import tarfile
from types import SimpleNamespace

import pytest

from fedsim.config.compose import ConfigError
from fedsim.results import outputs as results
from fedsim.results.outputs import RESULTS_MARKER, ship_results, unpack_results
from fedsim.run.cli import RUN_FILE, _save_run, resumed


def _lines(blob: bytes) -> list[str]:
    text = base64.b64encode(blob).decode()
    return [f"{RESULTS_MARKER}0/1 {text}"]


def _as_map(files: dict[str, bytes]) -> list[str]:
    return _lines(
        gzip.compress(
            json.dumps({k: base64.b64encode(v).decode() for k, v in files.items()}).encode()
        )
    )


def _as_tar(files: dict[str, bytes], links: dict[str, str] = None) -> list[str]:
    """The former format: what a remote operator could send to the former unpacker."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return _lines(buffer.getvalue())


PLANT = {
    "results.json": b"{}",
    "checkpoint/run.json": b'{"overrides": ["strategy._target_=os.system"]}',
}


@pytest.mark.parametrize(
    "files",
    [
        PLANT,
        {"results.json": b"{}", "../escaped.json": b"x"},
        {"/tmp/absolute.json": b"x"},
        {"a/b/c.png": b"x"},
        {".hidden.json": b"x"},
        {"run.key": b"x"},
    ],
)
@pytest.mark.parametrize("pack", [_as_map, _as_tar])
def test_names_outside_the_allow_list_refuse_the_shipment(tmp_path, files, pack):
    out = tmp_path / "results"
    out.mkdir()
    with pytest.raises(ValueError):
        unpack_results(pack(files), out)
    assert list(out.iterdir()) == []  # nothing written, not even the allowed file
    assert not (tmp_path / "escaped.json").exists()


def test_a_link_in_a_shipment_is_refused_and_a_local_link_is_not_followed(tmp_path):
    out, outside = tmp_path / "results", tmp_path / "outside.json"
    out.mkdir()
    outside.write_text("untouched")
    with pytest.raises(ValueError):
        unpack_results(_as_tar({}, links={"results.json": str(outside)}), out)
    (out / "summary.md").symlink_to(outside)  # a link already in the folder
    unpack_results(_as_map({"summary.md": b"shipped"}), out)
    assert outside.read_text() == "untouched"
    assert not (out / "summary.md").is_symlink() and (out / "summary.md").read_text() == "shipped"


def test_an_oversized_shipment_is_refused_before_it_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_SHIPMENT_BYTES", 1 << 20)
    bomb = _as_map({"results.json": b"0" * (2 << 20)})  # 2 MiB of zeros: a few KB compressed
    assert len(bomb[0]) < 20_000
    with pytest.raises(ValueError, match="exceed"):
        unpack_results(bomb, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "lines",
    [
        [f"{RESULTS_MARKER}0/1 %%%"],
        [f"{RESULTS_MARKER}x/1 AAAA"],
        _lines(b"not gzip"),
        _lines(gzip.compress(b"[1, 2]")),
        _lines(gzip.compress(b'{"results.json": 5}')),
    ],
)
def test_undecodable_shipments_are_refused_as_a_failed_run(tmp_path, lines):
    with pytest.raises(results.ShipmentRefused):
        unpack_results(lines, tmp_path)


def test_the_checkpoint_of_the_remote_side_is_not_shipped(tmp_path):
    src = tmp_path / "src"
    (src / "checkpoint").mkdir(parents=True)
    (src / "checkpoint" / "run.json").write_text("{}")
    (src / "results.json").write_text("{}")
    (src / "tensorboard").mkdir()
    (src / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"ev")
    dst = tmp_path / "dst"
    unpack_results(ship_results(src), dst)
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == [
        "results.json",
        "tensorboard",
        "tensorboard/events.out.tfevents.1.host",
    ]


def test_resume_refuses_a_run_file_it_did_not_write(tmp_path):
    """A planted checkpoint/run.json (e.g. by a former shipment) names any _target_: refused."""

    class Cfg:
        checkpoint, resume, results_dir = SimpleNamespace(enabled=True), False, str(tmp_path)

    _save_run(Cfg, ["seed=3"])
    assert resumed(str(tmp_path), []) == ["seed=3", "resume=true"]
    run_file = tmp_path / RUN_FILE
    run_file.write_text(json.dumps({"overrides": ["strategy._target_=os.system"]}))
    with pytest.raises(ConfigError, match="not written here"):
        resumed(str(tmp_path), [])


def test_a_client_error_reason_cannot_forge_a_log_line(caplog):
    """A client's error text is logged as one repr line: a newline in it cannot start a line
    of its own (e.g. a results line the launcher would take for the shipment)."""
    import logging

    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    from fedsim.runtime.inprocess_grid import InProcessGrid
    from fedsim.runtime.messaging import ANY, Messenger, Policy

    forged = f"x\n{RESULTS_MARKER}0/1 AAAA"

    class Reason(Exception):
        def __repr__(self):
            return forged

    def handle(msg):
        raise Reason()

    messenger = Messenger(
        InProcessGrid({1: handle, 2: lambda m: RecordDict({"c": ConfigRecord()})}), timeout=5
    )
    caplog.set_level("WARNING", logger="fedsim")
    logging.getLogger("fedsim").propagate = True  # the ServerApp may have turned it off
    messenger.exchange(
        "p",
        [
            Message(
                RecordDict({"c": ConfigRecord()}), dst_node_id=n, message_type=MessageType.QUERY
            )
            for n in (1, 2)
        ],
        Policy(ANY),
    )
    text = caplog.text
    assert "failed" in text and not any(
        line.startswith(RESULTS_MARKER) for line in text.splitlines()
    )
    assert messenger.faults["p"][1]["failed"] == 1


def test_hydras_record_arrives_in_its_own_folder_and_a_planted_link_there_is_refused(tmp_path):
    """``.hydra/`` is a folder the receiver creates; a link planted in its place is not followed."""
    src, dst, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside"
    (src / ".hydra").mkdir(parents=True)
    (src / ".hydra" / "config.yaml").write_text("seed: 1\n")
    unpack_results(ship_results(src), dst)
    assert (dst / ".hydra" / "config.yaml").read_text() == "seed: 1\n"
    other = tmp_path / "other"
    other.mkdir()
    outside.mkdir()
    (other / ".hydra").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link"):
        unpack_results(ship_results(src), other)
    assert list(outside.iterdir()) == []
