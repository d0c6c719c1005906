"""CKKS homomorphic encryption (TenSEAL) for weight averaging.

Clients share one secret context (key material in the node's key folder, created once by the
first client under a file lock; a multi-machine deployment copies that folder to every client).
The key is private the way the run's secret and the TLS keys are (``fedsim/privacy/secret.py``): written
0600 from its first byte into a 0700 folder, and refused on load when another user could read
or replace it.
The server only ever builds a context from the public bytes: no secret key, so it can
multiply ciphertexts by public weights and add them, never decrypt. A chunk of floats is
sent as one ciphertext per ``slots`` values, so no ciphertext spans more than its slots.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import tenseal as ts
from flwr.app import Array, ArrayRecord
from google.protobuf import empty_pb2, unknown_fields
from google.protobuf.message import DecodeError

from fedsim.privacy.he import messages as keys
from fedsim.privacy.secret import create_private_file, private_folder, read_private_file


@dataclass(frozen=True)
class CKKSParams:
    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 40, 60)
    global_scale_bits: int = 40

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def ciphertext_bytes(self) -> int:
        """The most bytes an honest ciphertext takes serialized, so that a peer's larger one is
        refused before TenSEAL parses it: two polynomials of N coefficients, a 64-bit word per
        coefficient and data modulus (all but the last, special one), as SEAL writes them
        uncompressed (it compresses with zstd: N 8192, moduli 60-40-40-60 measured 331 KB
        against these 393 KB); plus :data:`HEADROOM` for SEAL's and TenSEAL's headers."""
        return _with_headroom(
            2 * self.poly_modulus_degree * (len(self.coeff_mod_bit_sizes) - 1) * 8
        )

    @property
    def public_context_bytes(self) -> int:
        """The most bytes a public context (:func:`public_bytes`) takes: its public key is two
        polynomials at the key level (every modulus), the parameters beside it a few bytes
        (N 8192, moduli 60-40-40-60: 465 KB measured, 524 KB of words)."""
        return _with_headroom(2 * self.poly_modulus_degree * len(self.coeff_mod_bit_sizes) * 8)


HEADROOM = (
    1 / 16
)  # over the words: headers take under 1 KB, zstd's framing of incompressible words under 1/256


def _with_headroom(words_bytes: int) -> int:
    return int(words_bytes * (1 + HEADROOM))


def new_secret_context(params: CKKSParams) -> ts.Context:
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
    ctx.global_scale = 2**params.global_scale_bits
    return ctx


def client_context(params: CKKSParams, key_dir: str | Path) -> ts.Context:
    """The clients' shared secret context: loaded from ``key_dir``, created there if absent
    (whole or not at all: a new file, then renamed)."""
    folder = private_folder(Path(key_dir).expanduser())
    path = folder / f"ckks-{params.poly_modulus_degree}-{params.global_scale_bits}.secret"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)  # a creator killed mid-write (the lock is ours now)
            create_private_file(tmp, new_secret_context(params).serialize(save_secret_key=True))
            os.replace(tmp, path)
        ctx = ts.context_from(read_private_file(path, size=None))
    if not ctx.is_private():
        raise ValueError(f"{path} holds no secret key")
    return ctx


def public_bytes(ctx: ts.Context) -> bytes:
    """What the server may hold: parameters and public (encryption) key, no secret key."""
    return ctx.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )


class WrongKey(ValueError):
    """A message's ciphertexts were made under another key than this node's."""


def key_id(public: bytes) -> str:
    """Names a key (hash of the public context: parameters and public key); every HE message
    carries it, since decrypting under another secret key yields garbage, not an error."""
    return hashlib.sha256(public).hexdigest()[:16]


# What a public context (public_bytes) holds of TenSEAL's context message
# (tenseal/proto/tensealcontext.proto), by field number: at its top encryption_parameters,
# public_context and encryption_type (not private_context), inside public_context public_key,
# auto_flags and scale (not relin_keys, galois_keys)
ENCRYPTION_PARAMETERS = 1
PUBLIC_FIELDS = {ENCRYPTION_PARAMETERS, 2, 4}
PUBLIC_CONTEXT_FIELDS = {1, 2, 3}
CKKS_VECTOR_CIPHERTEXTS = (
    2  # the repeated ciphertexts of TenSEAL's CKKSVectorProto (tenseal/proto/tensors.proto)
)


def _fields(data: bytes) -> list:
    """A protobuf message's fields, read without its schema (TenSEAL ships none for Python)."""
    message = empty_pb2.Empty()
    message.ParseFromString(data)
    return list(unknown_fields.UnknownFieldSet(message))


@cache
def _parameters(params: CKKSParams) -> bytes:
    """``params`` as TenSEAL writes them in a context (SEAL's encryption parameters: N and the
    moduli CoeffModulus.Create picks for the bit sizes, the same for the same parameters)."""
    return next(
        f.data
        for f in _fields(public_bytes(new_secret_context(params)))
        if f.field_number == ENCRYPTION_PARAMETERS
    )


def _refuse_other_than_public(public: bytes, params: CKKSParams) -> None:
    """Refuse a client's context, before TenSEAL reads it, unless it is what :func:`public_bytes`
    writes under the run's ``params``: TenSEAL builds SEAL's tables for whatever parameters a
    context names (a crafted 9 KB one of N 32768 took 384 MB and 0.8 s), inflates a
    relinearization or Galois key set's count of keys from compressed bytes with no bound (515
    KB within the size cap took 462 MB), and a secret key is none of the server's."""
    try:
        top = _fields(public)
        inner = [
            f
            for part in top
            if part.field_number == 2 and isinstance(part.data, bytes)
            for f in _fields(part.data)
        ]
    except DecodeError as exc:
        raise ValueError(f"a public context that is no TenSEAL context: {exc}") from None
    extra = sorted({f.field_number for f in top} - PUBLIC_FIELDS) + sorted(
        f"public_context.{n}" for n in {f.field_number for f in inner} - PUBLIC_CONTEXT_FIELDS
    )
    if extra:
        raise ValueError(
            f"a public context with fields {extra} of TenSEAL's context message beside its "
            "parameters and public key (a secret key, relinearization or Galois keys)"
        )
    if {f.data for f in top if f.field_number == ENCRYPTION_PARAMETERS} != {_parameters(params)}:
        raise ValueError(
            f"a context under other CKKS parameters than the run's (N {params.poly_modulus_degree}, "
            f"moduli of {'-'.join(map(str, params.coeff_mod_bit_sizes))} bits)"
        )


def server_context(public: bytes, params: CKKSParams) -> ts.Context:
    """The context of a client's ``public`` bytes, under ``params`` (the run's: a ciphertext's
    size cap holds for them) with no secret key; ``public`` is refused unread when larger than
    such a context can be or holding anything else."""
    if len(public) > params.public_context_bytes:
        raise ValueError(
            f"a public context of {len(public)} bytes, at most {params.public_context_bytes} "
            "under the run's CKKS parameters"
        )
    _refuse_other_than_public(public, params)
    return ts.context_from(public)


def encrypt(ctx: ts.Context, values: np.ndarray, slots: int) -> list[bytes]:
    flat = np.asarray(values, dtype=np.float64).ravel()
    return [
        ts.ckks_vector(ctx, flat[i : i + slots]).serialize() for i in range(0, flat.size, slots)
    ]


def decrypt(ctx: ts.Context, blobs: list[bytes]) -> np.ndarray:
    return np.concatenate([np.asarray(ts.ckks_vector_from(ctx, b).decrypt()) for b in blobs])


def weighted_sum(
    ctx: ts.Context, per_client: list[list[bytes]], weights: list[float]
) -> list[bytes]:
    """sum_i w_i * ct_i, ciphertext by ciphertext, on ciphertexts only."""
    if len({len(c) for c in per_client}) != 1:
        raise ValueError("clients sent different numbers of ciphertexts for one chunk")
    out = []
    for parts in zip(*per_client):
        acc = None
        for blob, w in zip(parts, weights):
            term = ts.ckks_vector_from(ctx, blob) * float(w)
            acc = term if acc is None else acc + term
        out.append(acc.serialize())
    return out


class Probe:
    """Encrypted zeros under the server's (public) context, one per vector size: a client's
    ciphertext that cannot be weighted and added to them cannot enter :func:`weighted_sum`."""

    def __init__(self, ctx: ts.Context):
        self.ctx, self._zeros = ctx, {}

    def problem(self, blobs: list[bytes], floats: int, slots: int) -> str | None:
        """Why ``blobs`` (``floats`` values, ``slots`` per ciphertext) cannot be summed: one that
        does not parse, holds another number of values, or was made at another scale or level
        (TenSEAL refuses to add it); or a vector of several ciphertexts, refused before TenSEAL
        reads it: it inflates each from SEAL's compression (800 of zeros, 408 KB within the size
        cap, took 300 MB), where :func:`encrypt` makes one per vector."""
        for i, blob in enumerate(blobs):
            size = min(slots, floats - i * slots)
            try:
                if (
                    held := sum(f.field_number == CKKS_VECTOR_CIPHERTEXTS for f in _fields(blob))
                ) != 1:
                    return f"ciphertext {i} is a vector of {held} ciphertexts, expected 1"
                vector = ts.ckks_vector_from(self.ctx, blob)
                if vector.size() != size:
                    return f"ciphertext {i} holds {vector.size()} values, expected {size}"
                _ = vector * 1.0 + self._zero(size)
            except Exception as exc:  # noqa: BLE001 - whatever TenSEAL refuses in a client's bytes
                return f"ciphertext {i} cannot be summed: {type(exc).__name__}: {exc!s:.100}"
        return None

    def _zero(self, size: int):
        if size not in self._zeros:
            self._zeros[size] = ts.ckks_vector(self.ctx, np.zeros(size)) * 1.0
        return self._zeros[size]


def blobs_record(blobs: list[bytes]) -> ArrayRecord:
    """The ciphertexts as one byte array and their lengths: Flower moves every array of a
    message as objects of their own, one request each per hop (ServerApp, SuperLink, SuperNode,
    ClientApp), so an array per ciphertext cost an 8.5 MB aggregate 40 requests a hop."""
    return ArrayRecord(
        {
            keys.CIPHERTEXT_BYTES: Array(np.frombuffer(b"".join(blobs), dtype=np.uint8)),
            keys.CIPHERTEXT_LENGTHS: Array(np.array([len(b) for b in blobs], dtype=np.int64)),
        }
    )


class NotCiphertexts(ValueError):
    """A record that is not ciphertexts as :func:`blobs_record` makes them."""

    def __init__(self, why: str):
        super().__init__(f"not a record of ciphertexts: {why}")


def record_blobs(
    record: ArrayRecord, count: int | None = None, largest: int | None = None
) -> list[bytes]:
    """The ciphertexts of a record :func:`blobs_record` made (``count`` of them, where given, each
    of at most ``largest`` bytes: :attr:`CKKSParams.ciphertext_bytes`); :class:`NotCiphertexts` for
    any other. Read from the two arrays as decoded, not as declared (an
    Array's shape and dtype are the sender's words, its bytes are what came): flat uint8 bytes
    and int64 lengths, positive lengths that sum to the bytes (as Python ints: no wrap-around)."""
    if set(record) != {keys.CIPHERTEXT_BYTES, keys.CIPHERTEXT_LENGTHS}:
        raise NotCiphertexts(
            f"expected the arrays {keys.CIPHERTEXT_BYTES!r} and {keys.CIPHERTEXT_LENGTHS!r}"
        )
    data, lengths = record[keys.CIPHERTEXT_BYTES].numpy(), record[keys.CIPHERTEXT_LENGTHS].numpy()
    if data.dtype != np.uint8 or lengths.dtype != np.int64 or data.ndim != 1 or lengths.ndim != 1:
        raise NotCiphertexts("ciphertexts must be flat uint8 bytes with flat int64 lengths")
    sizes = lengths.tolist()
    if count is not None and len(sizes) != count:
        raise NotCiphertexts(f"expected {count} ciphertexts, got {len(sizes)}")
    if not sizes or min(sizes) <= 0 or sum(sizes) != data.size:
        raise NotCiphertexts(
            f"ciphertext lengths must be positive and sum to the {data.size} bytes"
        )
    if largest is not None and max(sizes) > largest:
        raise NotCiphertexts(
            f"a ciphertext of {max(sizes)} bytes, at most {largest} under the run's CKKS parameters"
        )
    blob, ends = data.tobytes(), np.cumsum(sizes).tolist()
    return [blob[start:end] for start, end in zip([0, *ends[:-1]], ends)]
