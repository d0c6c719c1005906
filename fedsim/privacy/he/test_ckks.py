"""The clients' CKKS secret key on disk: created 0600 from its first byte in a 0700 folder, and
refused on load where another local user could read or swap it (as the TLS keys and the run's
secret are); and the record its ciphertexts travel in, which a hostile peer may fill."""

import os
import stat
import struct
import zlib

import numpy as np
import pytest
import tenseal as ts
from flwr.app import Array, ArrayRecord

from fedsim.privacy.he import ckks
from fedsim.privacy.he import messages as keys

PARAMS = ckks.CKKSParams()


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_secret_key_is_never_readable_by_others(tmp_path, monkeypatch):
    """Under a permissive umask, every file the key passes through is 0600 when written (no
    chmod window), and its folder 0700."""
    seen = {}
    replace = os.replace

    def spy(src, dst, *args, **kwargs):  # the key's temporary file as it is renamed into place
        seen[os.fspath(dst)] = _mode(src)
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", spy)
    old = os.umask(0)
    try:
        ctx = ckks.client_context(PARAMS, tmp_path / "keys")
    finally:
        os.umask(old)
    assert ctx.is_private()
    (key,) = (tmp_path / "keys").glob("*.secret")
    assert _mode(tmp_path / "keys") == 0o700 and _mode(key) == 0o600
    assert seen and set(seen.values()) == {0o600}
    assert ckks.client_context(PARAMS, tmp_path / "keys").serialize(
        save_secret_key=True
    ) == ctx.serialize(save_secret_key=True)  # the same key loads back


def test_a_key_or_key_folder_open_to_others_is_refused(tmp_path):
    folder = tmp_path / "keys"
    ckks.client_context(PARAMS, folder)
    (key,) = folder.glob("*.secret")
    key.chmod(0o666)  # another local user could read (and replace) the federation's secret key
    with pytest.raises(PermissionError, match="mode 0600"):
        ckks.client_context(PARAMS, folder)
    key.chmod(0o600)
    folder.chmod(0o755)
    with pytest.raises(PermissionError, match="mode 0700"):
        ckks.client_context(PARAMS, folder)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # nor is a new key created where others can read it
    with pytest.raises(PermissionError):
        ckks.client_context(PARAMS, shared)
    assert not list(shared.iterdir())


def test_ciphertexts_travel_as_two_arrays_and_come_back_whole():
    blobs = [b"first", b"second ciphertext", b"3"]
    record = ckks.blobs_record(blobs)
    assert len(record) == 2
    assert ckks.record_blobs(record) == ckks.record_blobs(record, 3) == blobs


@pytest.mark.parametrize(
    "lengths",
    [
        [2**62] * 4 + [3],  # each positive, their int64 sum wraps around to the 3 bytes
        [3, 0],
        [4, -1],
        [2],
        [1, 3],
        [],
    ],
)
def test_lengths_that_do_not_cut_the_bytes_exactly_are_refused(lengths):
    record = ArrayRecord(
        {
            keys.CIPHERTEXT_BYTES: Array(np.frombuffer(b"abc", dtype=np.uint8)),
            keys.CIPHERTEXT_LENGTHS: Array(np.array(lengths, dtype=np.int64)),
        }
    )
    with pytest.raises(
        ValueError, match="not a record of ciphertexts: .*positive and sum to the 3 bytes"
    ):
        ckks.record_blobs(record)


def _lying(array: Array, **declared) -> Array:
    """``array`` with metadata its bytes do not have: Flower keeps what the sender declared."""
    for name, value in declared.items():
        setattr(array, name, value)
    return array


@pytest.mark.parametrize(
    "data, lengths",
    [
        (
            _lying(Array(np.frombuffer(b"abc", dtype=np.uint8)), shape=(2**62,)),
            Array(np.array([2**62] * 5, dtype=np.int64)),
        ),  # would sum (wrapping) to the declared bytes
        (
            _lying(Array(np.frombuffer(b"abc", dtype=np.uint8)), shape=(10**12,)),
            Array(np.array([1, 10**12 - 1], dtype=np.int64)),
        ),
        (
            Array(np.frombuffer(b"abc", dtype=np.uint8)),
            _lying(Array(np.array([1.0, 2.0])), dtype="int64"),
        ),
    ],
)
def test_a_record_is_checked_by_what_its_arrays_hold_not_by_what_they_declare(data, lengths):
    record = ArrayRecord({keys.CIPHERTEXT_BYTES: data, keys.CIPHERTEXT_LENGTHS: lengths})
    with pytest.raises(ValueError, match="not a record of ciphertexts"):
        ckks.record_blobs(record)


@pytest.mark.parametrize(
    "params",
    [PARAMS, ckks.CKKSParams(8192, (60, 20, 20, 60), 20), ckks.CKKSParams(4096, (40, 20, 40), 20)],
    ids=["N 8192, 60-40-40-60", "N 8192, 60-20-20-60", "N 4096, 40-20-40"],
)
def test_honest_ciphertexts_and_contexts_fit_the_caps_their_parameters_set(params):
    """The caps a peer's bytes are held to before TenSEAL reads them (an aggregate too, which has
    fewer moduli left), measured: every honest one fits, with room."""
    ctx = ckks.new_secret_context(params)
    public = ckks.public_bytes(ctx)
    fresh = ckks.encrypt(ctx, np.random.default_rng(0).normal(size=params.slots), params.slots)
    aggregate = ckks.weighted_sum(ckks.server_context(public, params), [fresh, fresh], [0.5, 0.5])
    assert max(map(len, fresh + aggregate)) < 0.9 * params.ciphertext_bytes
    assert len(public) < 0.9 * params.public_context_bytes
    record = ckks.blobs_record(fresh + [bytes(params.ciphertext_bytes + 1)])
    with pytest.raises(ValueError, match=f"a ciphertext of {params.ciphertext_bytes + 1} bytes"):
        ckks.record_blobs(record, largest=params.ciphertext_bytes)


@pytest.mark.parametrize(
    "other",
    [ckks.CKKSParams(4096, (40, 20, 40), 20), ckks.CKKSParams(8192, (60, 30, 50, 60), 40)],
    ids=["N 4096", "other moduli of as many bits"],
)
def test_a_context_under_other_parameters_than_the_runs_is_refused_before_tenseal_reads_it(
    other, monkeypatch
):
    """The caps hold for the run's parameters only: a client's context under others is refused,
    whichever key it names, before TenSEAL builds SEAL's tables for them (a crafted 9 KB context
    of N 32768 and 17 moduli, its public key compressed zeros, took 384 MB and 0.8 s)."""
    public = ckks.public_bytes(ckks.new_secret_context(other))
    parsed, parse = [], ts.context_from
    monkeypatch.setattr(ts, "context_from", lambda data: parsed.append(data) or parse(data))
    with pytest.raises(
        ValueError,
        match=r"other CKKS parameters than the run's \(N 8192, moduli of 60-40-40-60 bits",
    ):
        ckks.server_context(public, PARAMS)
    assert public not in parsed


def _seal(payload: bytes, compressed: bool) -> bytes:
    """A SEAL object as SEAL 4.x saves it: its 16-byte header (magic, header size, version,
    compression: zlib or none, total size), then its members (zlib-compressed or not)."""
    body = zlib.compress(payload, 9) if compressed else payload
    return (
        struct.pack("<HBBBBHQ", 0xA15E, 16, 4, 3, 1 if compressed else 0, 0, 16 + len(body)) + body
    )


def _varint(n: int) -> bytes:
    return bytes([n & 0x7F | 0x80]) + _varint(n >> 7) if n >= 0x80 else bytes([n])


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _key_set_bomb(params: ckks.CKKSParams, keys: int) -> bytes:
    """A client's public context with a Galois key set of ``keys`` keys of zeros (each as
    key-switching keys are: one key-level ciphertext per data modulus), zlib-compressed by SEAL's
    own serialization: a few hundred bytes a key that TenSEAL inflates to 2 N L words each."""
    honest = ckks.public_bytes(ckks.new_secret_context(params))
    parms_id = struct.pack(
        "<4Q", *ts.context_from(honest).seal_context().data.key_context_data().parms_id()
    )
    words, level = (
        2 * params.poly_modulus_degree * len(params.coeff_mod_bit_sizes),
        len(params.coeff_mod_bit_sizes),
    )
    array = _seal(struct.pack("<Q", words) + bytes(8 * words), compressed=False)
    key = _seal(
        parms_id
        + b"\x01"
        + struct.pack("<QQQdQ", 2, params.poly_modulus_degree, level, 1.0, 1)
        + array,
        compressed=False,
    )
    galois = _seal(
        parms_id
        + struct.pack("<Q", keys)
        + (struct.pack("<Q", level - 1) + key * (level - 1)) * keys,
        compressed=True,
    )
    return honest + _field(
        2, _field(5, galois)
    )  # a second public_context: protobuf merges it into the first


def test_a_public_context_holding_key_sets_is_refused_before_tenseal_inflates_them():
    """A hostile client's public context within the size cap may still hold a Galois (or
    relinearization) key set of compressed zeros, which TenSEAL inflates with no bound: 16
    keys here add 28 KB to the message and 25 MB once parsed (with a public key of zeros too,
    300 keys fit in 515 KB and took 462 MB). The server refuses any context holding more than
    parameters and a public key, unread."""
    bomb = _key_set_bomb(PARAMS, 16)
    assert (
        len(bomb) < PARAMS.public_context_bytes and ts.context_from(bomb).has_galois_keys()
    )  # what it was
    with pytest.raises(ValueError, match=r"fields \['public_context.5'\] .* Galois keys"):
        ckks.server_context(bomb, PARAMS)
    private = ckks.new_secret_context(PARAMS).serialize(
        save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
    )
    with pytest.raises(ValueError, match=r"fields \[3\] "):
        ckks.server_context(private, PARAMS)


def test_a_ciphertext_that_is_a_vector_of_several_is_refused_before_tenseal_reads_it(monkeypatch):
    """TenSEAL's vector message repeats its ciphertexts, and TenSEAL inflates each from SEAL's
    compression: 800 ciphertexts of zeros fit in 408 KB, within the size cap, and took 300 MB and
    1.6 s to parse before the probe refused them. fedsim's vectors hold one: a blob of several
    is refused unread, whatever they hold (here copies of an honest one)."""
    ctx = ckks.new_secret_context(PARAMS)
    honest = ckks.encrypt(ctx, np.ones(PARAMS.slots), PARAMS.slots)[0]
    probe = ckks.Probe(ckks.server_context(ckks.public_bytes(ctx), PARAMS))
    (ciphertext,) = (
        f.data for f in ckks._fields(honest) if f.field_number == ckks.CKKS_VECTOR_CIPHERTEXTS
    )
    several = (
        honest + _field(ckks.CKKS_VECTOR_CIPHERTEXTS, ciphertext) * 2
    )  # protobuf appends repeated fields
    parsed, parse = [], ts.ckks_vector_from
    monkeypatch.setattr(
        ts, "ckks_vector_from", lambda ctx, blob: parsed.append(blob) or parse(ctx, blob)
    )
    why = probe.problem([several], PARAMS.slots, PARAMS.slots)
    assert why == "ciphertext 0 is a vector of 3 ciphertexts, expected 1"
    assert several not in parsed
    assert probe.problem([honest], PARAMS.slots, PARAMS.slots) is None and parsed == [honest]
