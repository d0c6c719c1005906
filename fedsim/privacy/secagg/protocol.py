"""SecAgg+ (Bonawitz et al. 2017, with the sparse neighbour graph of Bell et al. 2020): the
server learns the sum of the live clients' quantized updates and nothing else about any one of
them, with clients dropping out at any stage.

A round, per sampled client ``u`` (each step one exchange on the messaging path):

1. **advertise**: ``u`` makes three EC key pairs (mask agreement, share encryption, signatures)
   and sends their public halves; or, where ``u`` sent them with its last unmask reply
   (:func:`advertise_ahead`), the server already holds them and this exchange is skipped;
2. **share**: the server names ``u``'s neighbours (:func:`neighbours`: a random ring of the
   round, each node with its ``degree`` nearest; all nodes when ``degree`` is null, SecAgg);
   ``u`` draws a self-mask seed ``b_u``, Shamir-shares ``b_u`` and its mask key among them with
   threshold ``t`` and sends each neighbour its two shares encrypted under their ECDH key (the
   server forwards ciphertexts it cannot read), with a SHA-256 of every share and of ``b_u``;
3. **mask** (the strategy's train message): ``u`` trains, quantizes ``w_u x_u`` (:func:`encode`),
   adds ``PRG(b_u)`` and, for each neighbour ``v`` whose shares it could decrypt,
   ``+-PRG(s_uv)`` with ``s_uv`` their ECDH key (mod 2^32);
4. **check**: the server names the live set (those whose masked input it accepted); each signs it;
5. **unmask**: with the signatures of its neighbours on the same set (at least ``t``), ``u``
   returns the seed share of each live neighbour and the key share of each dropped one; never
   both for one neighbour, once per round, and the public keys of its next round. The server
   checks every share against its hash, reconstructs ``b`` of the live and the mask keys of the
   dropped (:class:`Unmasker`), removes their masks and dequantizes (:func:`decode`).

**Threat model.** The server alone holds no share in plaintext before step 5 and then, for each
node, shares of its seed or of its key, never both (step 5's rule, the check's signatures with
``t`` above half a neighbourhood): a live node's masked input keeps ``PRG(b_u)`` or its pairwise
masks. A set of colluding clients below ``t`` holds fewer than ``t`` shares of any secret.
What the server learns: the sum, who dropped, the plaintext weights and metrics of the replies.
It picks the ring's order from the round's public seed; a server that chose the graph to
surround a node with colluders is outside this model (as in Bell et al.).

Flower's primitives are reused (``fedsim/flower/secure_aggregation.py``: ECDH + HKDF, Fernet,
the share framing, EC keys, ECDSA, quantization). Written here, and why: the key pairs
(:func:`key_pair`: NIST P-256, Flower's ``generate_key_pairs`` makes P-384 ones); Shamir's sharing
(:func:`create_shares`: Flower's is too slow for a server rebuilding 100 seeds a round); Flower's
``secaggplus_mod`` reads legacy fit messages (``FitIns``/``FitRes`` through ``compat``) and keeps
its state in the SuperNode's ``Context.state`` (one per SuperNode, shared by the logical clients
of a sharded node, lost when a run resumes), and its server half needs ``LegacyContext``;
Flower's ``pseudo_rand_gen`` folds a 32-byte seed to 32 bits (a mask anyone can search) and
is replaced by AES-256-CTR (:func:`prg`); its stage check lets a client restart a round and
answer a second unmask request, which step 5 refuses.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import os
import secrets
from dataclasses import asdict, dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedsim.flower import secure_aggregation as fl
from fedsim.seeding import stream

GRAPH = stream("secagg-graph", "round")
"""the order of a round's ring of neighbours (:func:`neighbours`): public, as the paper's is"""
RING = 2**32  # masks and sums are uint32: numpy's wrap-around is the ring's addition


class Refused(ValueError):
    """A message this client will not act on (a replay, a stage out of order, an inconsistent
    request); the ClientApp replies with the error and keeps its state."""


class Unrecoverable(RuntimeError):
    """The server cannot finish a round's sum (too few shares, a secret that fails its check)."""


def levels(num_clients: int) -> int:
    """L, the quantization levels over [-c, c] for a round of ``num_clients``: the largest that
    keeps their sum below 2^32 (and an int32 level, Flower's quantizer's type)."""
    return min(2**31 - 1, (RING - 1) // max(num_clients, 1))


def prg(secret: bytes, size: int) -> np.ndarray:
    """``size`` uniform uint32 values from a 32-byte ``secret`` (a self-mask seed, a pairwise
    key): AES-256 in counter mode under its SHA-256."""
    key = hashlib.sha256(b"fedsim-secagg-prg" + secret).digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(stream.update(bytes(4 * size)), dtype=np.uint32)


def encode(
    update: np.ndarray, weight: float, max_weight: float, clip: float, num_levels: int
) -> tuple[np.ndarray, int]:
    """``weight / max_weight`` as a level ``q`` of L and ``(q / L) * update``'s values clipped to
    [-c, c] and stochastically rounded to levels (Flower's quantizer), as one uint32 vector;
    and how many values the clip changed. A sum of ``n`` of these decodes within ``n * 2c / L``
    of the sum of the clipped weighted updates, per value (:func:`decode`)."""
    q_weight = round(min(max(weight / max_weight, 0.0), 1.0) * num_levels)
    scaled = update.astype(np.float64) * (q_weight / num_levels)
    values = fl.quantize([scaled], clip, num_levels)[0]
    vector = np.concatenate([[q_weight], values.ravel()]).astype(np.uint32)
    return vector, int(np.count_nonzero(np.abs(scaled) > clip))


def decode(
    total: np.ndarray, num_clients: int, clip: float, num_levels: int
) -> tuple[np.ndarray, float]:
    """The sum of ``num_clients`` :func:`encode` vectors as (the weighted update sum, the
    weight sum), both in units of ``max_weight``."""
    weights = float(total[0]) / num_levels
    values = total[1:].astype(np.float64) * (2 * clip / num_levels) - num_clients * clip
    return values, weights


def error_bound(num_clients: int, clip: float, num_levels: int) -> float:
    """The most a decoded sum's value is off the sum of the clipped weighted updates: each
    client's stochastic rounding moves it by less than one level, 2c / L."""
    return num_clients * 2 * clip / num_levels


def neighbours(nodes: list[int], degree: int | None, seed: int) -> dict[int, list[int]]:
    """SecAgg+'s graph of a round: ``nodes`` in a random ring (from the round's ``seed``),
    each with itself and its ``degree`` nearest (``degree // 2`` on either side); every node
    where ``degree`` is null or reaches them all (SecAgg). Sorted lists."""
    ranked = sorted(int(n) for n in nodes)  # node ids are 64-bit: permute positions, not ids
    order = [ranked[i] for i in np.random.default_rng(seed).permutation(len(ranked))]
    count = len(order)
    if degree is None or degree >= count - 1:
        return {n: sorted(order) for n in order}
    half = degree // 2
    return {
        order[p]: sorted({order[(p + d) % count] for d in range(-half, half + 1)})
        for p in range(count)
    }


def threshold(fraction: float, neighbourhood: int) -> int:
    """t for a neighbourhood of ``neighbourhood`` nodes (itself included): more than half of it
    (the consistency check needs it) and at least 2."""
    return min(neighbourhood, max(2, math.floor(fraction * neighbourhood) + 1))


CURVE = ec.SECP256R1()
"""The curve of a round's key pairs (:func:`key_pair`)."""
PRIME = 2**521 - 1  # a Mersenne prime: a seed or a P-256 scalar (32 bytes each) is one element
SHARE_BYTES = 66
KEY_BYTES = 32  # a P-256 private scalar


def create_shares(secret: bytes, t: int, n: int) -> list[bytes]:
    """Shamir's ``n`` shares of ``secret`` (at most 65 bytes), any ``t`` of which rebuild it and
    fewer tell nothing: ``f(1..n)`` of a random polynomial of degree ``t - 1`` over GF(2^521 - 1)
    with ``f(0)`` the secret; a share is its 4-byte index and ``f(index)``. Hand-written, not
    Flower's ``create_shares``: that one (PyCryptodome's GF(2^128), pure-Python multiplication,
    in 16-byte chunks) took 0.25 s of server time to rebuild one 32-byte seed from 27 shares,
    which at 100 clients is most of a round; Python's integers take microseconds."""
    draw = secrets.SystemRandom()
    coefficients = [int.from_bytes(secret, "big")] + [draw.randrange(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coefficients):
            y = (y * x + c) % PRIME
        shares.append(x.to_bytes(4, "big") + y.to_bytes(SHARE_BYTES, "big"))
    return shares


def combine_shares(shares: list[bytes], size: int) -> bytes:
    """The ``size``-byte secret of ``shares`` (Lagrange interpolation at 0)."""
    xs = tuple(int.from_bytes(s[:4], "big") for s in shares)
    if len(set(xs)) != len(xs):
        raise ValueError("two shares of one index")
    ys = [int.from_bytes(s[4:], "big") for s in shares]
    secret = sum(y * c for y, c in zip(ys, _lagrange_at_zero(xs))) % PRIME
    if secret >= 256**size:
        raise ValueError("the shares do not rebuild a secret of this size")
    return secret.to_bytes(size, "big")


@functools.lru_cache(maxsize=64)
def _lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """The Lagrange coefficients at 0 of the indices ``xs``: the same holders answer for many
    nodes of a round, so they are computed once."""
    out = []
    for i, xi in enumerate(xs):
        num = den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num, den = num * xj % PRIME, den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)


def key_pair():
    """A fresh key pair of a round (mask agreement, share encryption or signatures) on NIST P-256,
    the curve of Bonawitz et al.'s implementation: 128-bit security, the level Fernet's AES-128
    already holds the shares at, so Flower's P-384 (``generate_key_pairs``) bought nothing the
    protocol keeps, at 7 times the cost of each key agreement and signature check (0.41 against
    0.05 ms an ECDH, 0.55 against 0.07 ms a verification here; a client of a 100-node SecAgg
    round makes about 300 agreements and 90 checks, the server 90 checks). Flower's
    ECDH + HKDF, PEM and ECDSA helpers take keys of any curve and are reused."""
    private_key = ec.generate_private_key(CURVE)
    return private_key, private_key.public_key()


def key_scalar(private_pem: bytes) -> bytes:
    """A P-256 private key's scalar (32 bytes): what is shared of a mask key."""
    value = fl.bytes_to_private_key(private_pem).private_numbers().private_value
    return value.to_bytes(KEY_BYTES, "big")


def key_of_scalar(scalar: bytes):
    return ec.derive_private_key(int.from_bytes(scalar, "big"), CURVE)


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def check_message(round_number: int, live: list[int]) -> bytes:
    """What a client signs at the check: the round and the live set."""
    return b"fedsim-secagg-check" + round_number.to_bytes(8, "little") + _ids(live)


def _ids(nodes: list[int]) -> bytes:
    return b"".join(int(n).to_bytes(8, "little") for n in sorted(nodes))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


@dataclass
class ClientRound:
    """One client's state in one round, kept on its disk between stages (as JSON: bytes as
    base64, ``ClientRound.load``). ``stage``: the last stage it completed."""

    round: int
    self_id: int
    stage: str
    secrets: dict[str, str]  # mask / share / sign private keys (PEM), seed
    public: dict[str, str]  # its own public keys
    neighbours: dict[str, list[str]] = field(default_factory=dict)  # id -> [mask, share, sign]
    threshold: int = 0
    seed_shares: dict[str, str] = field(default_factory=dict)  # source id -> its share for me
    key_shares: dict[str, str] = field(default_factory=dict)
    live: list[int] = field(default_factory=list)  # the live set it signed
    min_live: int = 0  # the least live set it signs: the count its DP noise share is sized for
    ahead: dict[str, dict[str, str]] = field(default_factory=dict)  # next round's keys (unmask)

    def dump(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, data: dict) -> ClientRound:
        return cls(**data)

    def secret(self, name: str) -> bytes:
        return _unb64(self.secrets[name])

    def expect(self, round_number: int, stage: str) -> None:
        """Refuse a message of another round or out of the stage order."""
        if round_number != self.round:
            raise Refused(
                f"a message of round {round_number} while in round {self.round}: replayed or stale"
            )
        if self.stage != stage:
            raise Refused(
                f"round {self.round} is at stage '{self.stage}', not '{stage}': a replayed or "
                "out-of-order message"
            )


KINDS = ("mask", "share", "sign")


def _fresh_keys() -> tuple[dict[str, str], dict[str, str]]:
    """Three fresh key pairs (:data:`KINDS`): private halves (PEM) and public halves, base64."""
    secrets, public = {}, {}
    for kind in KINDS:
        private_key, public_key = key_pair()
        secrets[kind] = _b64(fl.private_key_to_bytes(private_key))
        public[kind] = _b64(fl.public_key_to_bytes(public_key))
    return secrets, public


def advertise(last_round: int | None, round_number: int, self_id: int) -> tuple[ClientRound, dict]:
    """Step 1: this round's key pairs; refused for a round not after the last one this client
    took part in (a replayed or stale advertise would restart a round and reuse nothing, but
    it must not let a server run one round twice)."""
    if last_round is not None and round_number <= last_round:
        raise Refused(f"round {round_number} after round {last_round}: replayed or stale")
    secrets, public = _fresh_keys()
    state = ClientRound(round_number, self_id, "advertise", secrets, public)
    return state, {kind: _unb64(public[kind]) for kind in KINDS}


def advertise_ahead(state: ClientRound) -> dict[str, bytes]:
    """Step 1 of this node's next round, done at the end of this one: fresh key pairs, sent with
    the unmask reply, so that a server sampling the node again skips the key exchange
    (:func:`take_ahead`). They share nothing with the round just unmasked, whose secrets are gone."""
    if state.stage != "unmask":
        raise Refused(f"keys for a next round while round {state.round} is at '{state.stage}'")
    secrets, public = _fresh_keys()
    state.ahead = {"secrets": secrets, "public": public}
    return {kind: _unb64(public[kind]) for kind in KINDS}


def take_ahead(state: ClientRound, round_number: int) -> ClientRound:
    """Round ``round_number`` on the keys sent ahead (:func:`advertise_ahead`) where this node
    holds them and the round is later than its last; else ``state`` as it is (the share step then
    refuses what is out of order). The new round holds no keys ahead: each pair serves once."""
    if not state.ahead or state.stage != "unmask" or round_number <= state.round:
        return state
    ahead = state.ahead
    return ClientRound(round_number, state.self_id, "advertise", ahead["secrets"], ahead["public"])


def share(
    state: ClientRound, round_number: int, keys: dict[int, tuple[bytes, bytes, bytes]], t: int
):
    """Step 2: check the neighbourhood the server sent (this node in it with its own keys, no
    key twice, at least ``t`` nodes, ``t`` above half of them), Shamir-share a fresh seed and
    the mask key; returns (destinations, ciphertexts, seed-share hashes, key-share hashes by
    the sorted neighbourhood, the seed's hash)."""
    state.expect(round_number, "advertise")
    ids = sorted(keys)
    own = tuple(_unb64(state.public[kind]) for kind in KINDS)
    if keys.get(state.self_id) != own:
        raise Refused("the neighbourhood does not hold this node's keys under its id")
    if len({k for trio in keys.values() for k in trio}) != 3 * len(keys):
        raise Refused("a public key appears twice in the neighbourhood")
    if not (len(ids) // 2 < t <= len(ids)) or t < 2:
        raise Refused(f"threshold {t} for {len(ids)} neighbours: needs more than half, >= 2")
    seed = os.urandom(32)
    seed_shares = create_shares(seed, t, len(ids))
    key_shares = create_shares(key_scalar(state.secret("mask")), t, len(ids))
    share_key = fl.bytes_to_private_key(state.secret("share"))
    dsts, ciphertexts = [], []
    for node, seed_share, key_share in zip(ids, seed_shares, key_shares):
        if node == state.self_id:
            state.seed_shares[str(node)], state.key_shares[str(node)] = (
                _b64(seed_share),
                _b64(key_share),
            )
            continue
        shared = fl.generate_shared_key(share_key, fl.bytes_to_public_key(keys[node][1]))
        plain = fl.share_keys_plaintext_concat(state.self_id, node, seed_share, key_share)
        dsts.append(node)
        ciphertexts.append(fl.encrypt(shared, plain))
    state.secrets["seed"] = _b64(seed)
    state.neighbours = {str(n): [_b64(k) for k in keys[n]] for n in ids}
    state.threshold, state.stage = t, "share"
    return (
        dsts,
        ciphertexts,
        [digest(s) for s in seed_shares],
        [digest(s) for s in key_shares],
        digest(seed),
    )


def _neighbour_key(state: ClientRound, node: int, kind: str) -> bytes:
    return _unb64(state.neighbours[str(node)][KINDS.index(kind)])


def mask(
    state: ClientRound, round_number: int, forwarded: dict[int, bytes], vector: np.ndarray
) -> tuple[np.ndarray, list[int]]:
    """Step 3: keep the shares each forwarded ciphertext holds for this node (one that does not
    decrypt, or names another source or destination, is left out, and so is its sender's
    pairwise mask); ``vector`` (:func:`encode`) plus the self mask and the pairwise masks.
    Refused with fewer than ``t`` nodes left to hold its shares."""
    state.expect(round_number, "share")
    share_key = fl.bytes_to_private_key(state.secret("share"))
    kept = []
    for src, token in sorted(forwarded.items()):
        if src == state.self_id or str(src) not in state.neighbours:
            continue
        shared = fl.generate_shared_key(
            share_key, fl.bytes_to_public_key(_neighbour_key(state, src, "share"))
        )
        try:
            actual, dst, seed_share, key_share = fl.share_keys_plaintext_separate(
                fl.decrypt(shared, token)
            )
        except Exception:  # noqa: BLE001 - a token that does not decrypt: the sender is left out
            continue
        if actual != src or dst != state.self_id:
            continue
        state.seed_shares[str(src)], state.key_shares[str(src)] = _b64(seed_share), _b64(key_share)
        kept.append(src)
    if len(kept) + 1 < state.threshold:
        raise Refused(f"{len(kept)} neighbours' shares decrypted; {state.threshold - 1} needed")
    out = vector.astype(np.uint32) + prg(state.secret("seed"), vector.size)
    mask_key = fl.bytes_to_private_key(state.secret("mask"))
    for node in kept:
        pair = pairwise_seed(mask_key, _neighbour_key(state, node, "mask"))
        out = out + prg(pair, vector.size) if state.self_id > node else out - prg(pair, vector.size)
    state.stage = "mask"
    return out, kept


def pairwise_seed(private_key, public_pem: bytes) -> bytes:
    """The seed of the pairwise mask of two nodes: their ECDH key (HKDF-SHA256)."""
    return base64.urlsafe_b64decode(
        fl.generate_shared_key(private_key, fl.bytes_to_public_key(public_pem))
    )


def check(state: ClientRound, round_number: int, live: list[int]) -> bytes:
    """Step 4: sign the live set, once per round; refused where this node is not in it (the
    server has its masked input) or lists fewer than ``t`` of its neighbours; under distributed DP
    (``min_live`` set at the mask stage, ``ddp.py``) also a live set smaller than ``min_live``, or
    one naming a neighbour whose shares it does not hold (a ghost padding the count: it sent no
    masked input that carries noise)."""
    state.expect(round_number, "mask")
    if state.self_id not in live:
        raise Refused("the live set leaves out this node, whose masked input the server holds")
    if len(set(live) & {int(n) for n in state.neighbours}) < state.threshold:
        raise Refused(f"fewer than t={state.threshold} of this node's neighbours are live")
    if len(set(live)) < state.min_live:
        raise Refused(
            f"a live set of {len(set(live))}: this node's DP noise share is sized for at least "
            f"{state.min_live} (ddp.py)"
        )
    if state.min_live and not {n for n in live if str(n) in state.neighbours} <= {
        int(n) for n in state.seed_shares
    }:
        raise Refused("the live set names a neighbour that sent this node no shares")
    state.live, state.stage = sorted(live), "check"
    return fl.sign_message(
        fl.bytes_to_private_key(state.secret("sign")), check_message(round_number, live)
    )


def unmask(
    state: ClientRound,
    round_number: int,
    live: list[int],
    dropped: list[int],
    signatures: dict[int, bytes],
) -> tuple[list[int], list[bytes]]:
    """Step 5, the consistency check first: ``live`` is the set this node signed, ``dropped``
    shares no node with it, and at least ``t`` of its neighbours signed the same set. Then the
    seed share of each live neighbour and the key share of each dropped one, once; the round's
    secrets (private keys, seed, the shares held) are then forgotten, so its state on disk
    unmasks nothing (with the server's copy of the masked input, they would)."""
    state.expect(round_number, "check")
    if sorted(live) != state.live:
        raise Refused("the live set differs from the one this node signed")
    if set(live) & set(dropped):
        raise Refused("a node is named both live and dropped")
    message = check_message(round_number, live)
    valid = sum(
        1
        for node, signature in signatures.items()
        if str(node) in state.neighbours
        and fl.verify_signature(
            fl.bytes_to_public_key(_neighbour_key(state, node, "sign")), message, signature
        )
    )
    if valid < state.threshold:
        raise Refused(
            f"{valid} of this node's neighbours signed the live set; t={state.threshold} needed"
        )
    ids, shares = [], []
    for node in sorted(live):
        if str(node) in state.seed_shares:
            ids.append(node)
            shares.append(_unb64(state.seed_shares[str(node)]))
    for node in sorted(dropped):
        if str(node) in state.key_shares:
            ids.append(node)
            shares.append(_unb64(state.key_shares[str(node)]))
    state.stage = "unmask"
    state.secrets, state.seed_shares, state.key_shares = {}, {}, {}
    return ids, shares


@dataclass
class Advertised:
    """What the server keeps of a node's step 1 and 2 replies."""

    keys: tuple[bytes, bytes, bytes]  # mask, share, sign public keys (PEM)
    seed_hashes: dict[int, bytes] = field(default_factory=dict)  # holder -> hash of its share
    key_hashes: dict[int, bytes] = field(default_factory=dict)
    seed_commitment: bytes = b""


class Unmasker:
    """The server's step 5: the shares each responder sent, checked against their hashes
    (a share that fails it is not used: :meth:`problem`), the live nodes' seeds and the dropped
    nodes' mask keys reconstructed from ``t`` of them, their masks removed from the sum."""

    def __init__(self, book: dict[int, Advertised], t: dict[int, int]):
        self.book, self.t = book, t

    def problem(
        self, holder: int, ids: list[int], shares: list[bytes], live, dropped
    ) -> str | None:
        """Why ``holder``'s unmask reply cannot be used (None: every share matches its hash)."""
        for node, piece in zip(ids, shares, strict=True):
            if node in live:
                expected = self.book[node].seed_hashes.get(holder)
            elif node in dropped:
                expected = self.book[node].key_hashes.get(holder)
            else:
                return f"a share of node {node}, neither live nor dropped"
            if expected is None or digest(piece) != expected:
                return f"its share of node {node} does not match the hash node {node} sent"
        return None

    def secrets(
        self, replies: dict[int, tuple[list[int], list[bytes]]], live: list[int], dropped: list[int]
    ) -> tuple[dict[int, bytes], dict[int, object]]:
        """The live nodes' seeds and the dropped nodes' mask keys, each from at least ``t``
        checked shares and checked against the node's commitment (its seed's hash, its public
        mask key); :class:`Unrecoverable` names the node where that fails."""
        pieces: dict[int, list[bytes]] = {}
        for ids, shares in replies.values():
            for node, piece in zip(ids, shares):
                pieces.setdefault(node, []).append(piece)
        seeds, keys = {}, {}
        for node in live + dropped:
            got = pieces.get(node, [])
            if len(got) < self.t[node]:
                raise Unrecoverable(
                    f"node {node}: {len(got)} shares came back, t={self.t[node]} needed to "
                    f"{'unmask its input' if node in live else 'remove its pairwise masks'}"
                )
            try:
                secret = combine_shares(got[: self.t[node]], 32 if node in live else KEY_BYTES)
            except ValueError as exc:
                raise Unrecoverable(f"node {node}: {exc}") from exc
            if node in live:
                if digest(secret) != self.book[node].seed_commitment:
                    raise Unrecoverable(
                        f"node {node}: its shares do not rebuild its committed seed"
                    )
                seeds[node] = secret
                continue
            try:
                private_key = key_of_scalar(secret)
            except ValueError as exc:
                raise Unrecoverable(f"node {node}: its shares do not rebuild a key") from exc
            if fl.public_key_to_bytes(private_key.public_key()) != self.book[node].keys[0]:
                raise Unrecoverable(f"node {node}: its shares rebuild another key than it sent")
            keys[node] = private_key
        return seeds, keys

    def total(
        self,
        masked: dict[int, np.ndarray],
        masked_with: dict[int, list[int]],
        seeds: dict[int, bytes],
        keys: dict[int, object],
    ) -> np.ndarray:
        """The live nodes' masked inputs less their self masks and the pairwise masks they
        share with dropped nodes (those with live nodes cancel in the sum)."""
        size = next(iter(masked.values())).size
        total = np.zeros(size, dtype=np.uint32)
        for node, vector in masked.items():  # in place: no fresh 4-byte-per-value array a step
            total += vector
            total -= prg(seeds[node], size)
            for other in masked_with[node]:
                if other in keys:
                    pair = prg(pairwise_seed(keys[other], self.book[node].keys[0]), size)
                    if node > other:
                        total -= pair
                    else:
                        total += pair
        return total
