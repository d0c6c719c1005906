"""Attacks on SecAgg+, the test playing the server: what it holds of each secret, that it cannot
unmask a live client (alone, by claiming it dropped, or by showing clients different live
sets), and that replayed round messages are refused. Clients run the protocol's own steps
(``protocol.py``); the honest path through messages is ``fedsim_strategies/test_secagg.py``."""

import numpy as np
import pytest

from fedsim.flower import secure_aggregation as fl
from fedsim.privacy.secagg import protocol as p

N, SIZE, LEVELS, CLIP = 5, 40, p.levels(5), 4.0
T = p.threshold(0.5, N)  # 3 of 5


class Federation:
    """Five clients through steps 1-3 of a round, everything the server saw kept."""

    def __init__(self, round_number=1, states=None):
        rng = np.random.default_rng(round_number)
        self.round = round_number
        self.updates = {n: rng.normal(size=SIZE) for n in range(1, N + 1)}
        self.states, self.keys, self.book = {}, {}, {}
        for n in self.updates:
            last = states[n].round if states else None
            self.states[n], public = p.advertise(last, round_number, n)
            self.keys[n] = tuple(public[k] for k in p.KINDS)
            self.book[n] = p.Advertised(self.keys[n])
        self.tokens = {}
        for n, state in self.states.items():
            dsts, tokens, seed_hashes, key_hashes, commitment = p.share(
                state, round_number, self.keys, T
            )
            self.book[n].seed_hashes = dict(zip(sorted(self.keys), seed_hashes))
            self.book[n].key_hashes = dict(zip(sorted(self.keys), key_hashes))
            self.book[n].seed_commitment = commitment
            self.tokens.update({(n, d): t for d, t in zip(dsts, tokens)})
        self.vectors = {n: p.encode(u, 1.0, 1.0, CLIP, LEVELS)[0] for n, u in self.updates.items()}
        self.masked, self.masked_with = {}, {}
        for n, state in self.states.items():
            forwarded = {s: t for (s, d), t in self.tokens.items() if d == n}
            self.masked[n], self.masked_with[n] = p.mask(
                state, round_number, forwarded, self.vectors[n]
            )

    def signatures(self, live, signers):
        return {n: p.check(self.states[n], self.round, live) for n in signers}


def test_the_sum_of_live_clients_is_unmasked_and_nothing_else():
    fed = Federation()
    live, dropped = [1, 2, 3, 4], [5]  # 5's masked input never arrived
    signatures = fed.signatures(live, live)
    replies = {n: p.unmask(fed.states[n], 1, live, dropped, signatures) for n in live}
    unmasker = p.Unmasker(fed.book, dict.fromkeys(fed.keys, T))
    for holder, (ids, shares) in replies.items():
        assert unmasker.problem(holder, ids, shares, set(live), set(dropped)) is None
    seeds, keys = unmasker.secrets(replies, live, dropped)
    total = unmasker.total({n: fed.masked[n] for n in live}, fed.masked_with, seeds, keys)
    values, weight = p.decode(total, len(live), CLIP, LEVELS)
    want = sum(fed.updates[n] for n in live)
    assert weight == len(live)
    assert np.abs(values - want).max() <= p.error_bound(len(live), CLIP, LEVELS)


def test_the_server_alone_holds_no_share_before_unmask_and_never_both_of_one_node():
    """Before step 5 the server holds only ciphertexts under keys it lacks; after it, shares of
    the live nodes' seeds and the dropped nodes' keys, never a key share of a live node."""
    fed = Federation()
    wrong_key = fl.generate_shared_key(*_fresh_pair())
    for token in fed.tokens.values():
        with pytest.raises(Exception):  # noqa: B017 - Fernet's InvalidToken
            fl.decrypt(wrong_key, token)
    live, dropped = [1, 2, 3, 4], [5]
    signatures = fed.signatures(live, live)
    replies = {n: p.unmask(fed.states[n], 1, live, dropped, signatures) for n in live}
    key_shares_of_live = [
        node
        for holder, (ids, shares) in replies.items()
        for node, share in zip(ids, shares)
        if node in live and p.digest(share) == fed.book[node].key_hashes[holder]
    ]
    assert key_shares_of_live == []


def test_server_cannot_unmask_a_live_client_from_its_self_mask_alone():
    """With every seed share it can get, a live client's masked input still carries its pairwise
    masks: what the server recovers is uniform, nowhere near the update."""
    fed = Federation()
    live = list(fed.keys)
    signatures = fed.signatures(live, live)
    replies = {n: p.unmask(fed.states[n], 1, live, [], signatures) for n in live}
    unmasker = p.Unmasker(fed.book, dict.fromkeys(fed.keys, T))
    seeds, _ = unmasker.secrets(replies, live, [])
    guess = fed.masked[1] - p.prg(seeds[1], SIZE + 1)
    assert np.mean(guess.astype(np.int64) != fed.vectors[1].astype(np.int64)) > 0.9
    assert np.abs(guess.astype(np.float64) - fed.vectors[1]).mean() > 2**28


def test_claiming_a_live_client_dropped_leaves_it_masked():
    """The server has node 1's masked input, then names 1 dropped to everyone: it rebuilds 1's
    mask key, removes its pairwise masks, and is left with the self mask, whose seed shares
    nobody gives it (1 is not live), and no client answers a second unmask with 1 live."""
    fed = Federation()
    live, dropped = [2, 3, 4, 5], [1]
    signatures = fed.signatures(live, live)
    replies = {n: p.unmask(fed.states[n], 1, live, dropped, signatures) for n in live}
    unmasker = p.Unmasker(fed.book, dict.fromkeys(fed.keys, T))
    seeds, keys = unmasker.secrets(replies, live, dropped)
    assert 1 in keys and 1 not in seeds
    without_pairs = fed.masked[1]
    for other in fed.masked_with[1]:
        pad = p.prg(p.pairwise_seed(keys[1], fed.keys[other][0]), SIZE + 1)
        without_pairs = without_pairs - pad if 1 > other else without_pairs + pad
    assert np.mean(without_pairs != fed.vectors[1]) > 0.9  # PRG(b_1) still on it
    with pytest.raises(p.Refused, match="at stage 'unmask', not 'check'"):
        p.unmask(fed.states[2], 1, [1, 2, 3, 4, 5], [], signatures)


def test_split_live_sets_are_refused_by_the_consistency_check():
    """The server shows nodes 1-2 a live set with node 5 and nodes 3-4 one without it, hoping for
    5's seed shares from the first and its key shares from the second: each set carries fewer
    than t signatures, and every client refuses."""
    fed = Federation()
    with_5, without_5 = [1, 2, 3, 4, 5], [1, 2, 3, 4]
    signed_with = fed.signatures(with_5, [1, 2])
    signed_without = fed.signatures(without_5, [3, 4])
    for n in (1, 2):
        with pytest.raises(p.Refused, match="neighbours signed the live set"):
            p.unmask(fed.states[n], 1, with_5, [], {**signed_with, **signed_without})
    for n in (3, 4):
        with pytest.raises(p.Refused, match="neighbours signed the live set"):
            p.unmask(fed.states[n], 1, without_5, [5], {**signed_with, **signed_without})


def test_a_live_set_other_than_the_signed_one_is_refused():
    fed = Federation()
    live = list(fed.keys)
    signatures = fed.signatures(live, live)
    with pytest.raises(p.Refused, match="differs from the one this node signed"):
        p.unmask(fed.states[1], 1, [1, 2, 3, 4], [5], signatures)
    with pytest.raises(p.Refused, match="both live and dropped"):
        p.unmask(fed.states[1], 1, live, [5], signatures)


def test_a_client_left_out_of_the_live_set_refuses_to_sign():
    fed = Federation()
    with pytest.raises(p.Refused, match="leaves out this node"):
        p.check(fed.states[1], 1, [2, 3, 4, 5])


def test_replayed_round_messages_are_refused():
    """A stage out of order, an old round's advertise and an old round's ciphertexts."""
    old = Federation(1)
    with pytest.raises(p.Refused, match="at stage 'mask', not 'advertise'"):
        p.share(old.states[1], 1, old.keys, T)  # the share request replayed after masking
    with pytest.raises(p.Refused, match="replayed or stale"):
        p.advertise(1, 1, 1)  # round 1 again
    new = Federation(2, old.states)
    with pytest.raises(p.Refused, match="of round 1 while in round 2"):
        p.check(new.states[1], 1, list(new.keys))
    state, public = p.advertise(2, 3, 1)
    fresh_keys = {**new.keys, 1: tuple(public[k] for k in p.KINDS)}
    p.share(state, 3, fresh_keys, T)
    replayed = {s: t for (s, d), t in old.tokens.items() if d == 1}  # round 1's, under old keys
    with pytest.raises(p.Refused, match="shares decrypted"):
        p.mask(state, 3, replayed, new.vectors[1])


def test_keys_sent_ahead_serve_one_later_round():
    """The attack: a server that holds a node's keys for its next round (sent with its unmask
    reply) replays an old share request, or uses the keys for two rounds, to make the node mask
    twice under one key pair (two inputs under the same pairwise masks: their difference is the
    difference of the updates). The keys serve one round after the last, once; they are fresh,
    not the finished round's; no node makes them before its round is unmasked."""
    fed = Federation(1)
    live = sorted(fed.keys)
    signatures = fed.signatures(live, live)
    with pytest.raises(p.Refused, match="keys for a next round while round 1 is at 'check'"):
        p.advertise_ahead(fed.states[1])
    state = fed.states[1]
    p.unmask(state, 1, live, [], signatures)
    public = p.advertise_ahead(state)
    ahead = tuple(public[k] for k in p.KINDS)
    assert set(ahead).isdisjoint(fed.keys[1])
    assert p.take_ahead(state, 1) is state  # round 1 again: the share step refuses it
    with pytest.raises(p.Refused, match="at stage 'unmask', not 'advertise'"):
        p.share(p.take_ahead(state, 1), 1, fed.keys, T)
    keys = {**fed.keys, 1: ahead}
    round_2 = p.take_ahead(state, 2)
    assert round_2.round == 2 and not round_2.ahead
    p.share(round_2, 2, keys, T)
    assert p.take_ahead(round_2, 3) is round_2  # the pairs are spent: round 3 needs fresh ones
    with pytest.raises(p.Refused, match="of round 3 while in round 2"):
        p.share(round_2, 3, keys, T)


def test_a_neighbourhood_without_this_nodes_keys_or_with_a_low_threshold_is_refused():
    state, public = p.advertise(None, 1, 1)
    others = {n: p.advertise(None, 1, n)[1] for n in (2, 3)}
    keys = {n: tuple(pub[k] for k in p.KINDS) for n, pub in {1: public, **others}.items()}
    with pytest.raises(p.Refused, match="more than half"):
        p.share(state, 1, keys, 1)
    with pytest.raises(p.Refused, match="this node's keys"):
        p.share(state, 1, {**keys, 1: keys[2]}, 2)


def test_colluders_below_t_cannot_rebuild_a_seed():
    """t - 1 shares of a seed (what t - 1 colluding neighbours hold) rebuild something else."""
    seed = b"s" * 32
    shares = p.create_shares(seed, T, N)
    try:
        rebuilt = p.combine_shares(shares[: T - 1], 32)
    except ValueError:
        rebuilt = None
    assert rebuilt != seed
    assert p.combine_shares(shares[:T], 32) == seed == p.combine_shares(shares[-T:], 32)


def _fresh_pair():
    private_key, _ = fl.generate_key_pairs()
    _, public_key = fl.generate_key_pairs()
    return private_key, public_key


def test_split_live_sets_in_a_forged_sparse_graph_still_leave_one_secret_of_each_node():
    """The attack: the server forges a sparse graph (each node a neighbourhood of 2 or 3, t = 2)
    and shows two groups different live sets, node 1 live to {1, 2, 4} and dropped to {3, 5}.
    Each group's neighbourhoods hold t signatures of its own set, so the consistency check
    passes everywhere; still, a node's shares lie with fewer than 2t holders, each giving one:
    the server rebuilds node 1's seed, never also its mask key (nor any node's both)."""
    hoods = {1: [1, 2, 3], 2: [1, 2, 4], 3: [1, 3, 5], 4: [2, 4], 5: [3, 5]}
    states, keys, book = {}, {}, {}
    for n in hoods:
        states[n], public = p.advertise(None, 1, n)
        keys[n] = tuple(public[k] for k in p.KINDS)
        book[n] = p.Advertised(keys[n])
    tokens = {}
    for n, hood in hoods.items():
        dsts, cts, seed_hashes, key_hashes, commitment = p.share(
            states[n], 1, {m: keys[m] for m in hood}, 2
        )
        book[n].seed_hashes, book[n].key_hashes = (
            dict(zip(hood, seed_hashes)),
            dict(zip(hood, key_hashes)),
        )
        book[n].seed_commitment = commitment
        tokens.update({(n, d): t for d, t in zip(dsts, cts)})
    for n, state in states.items():
        forwarded = {s: t for (s, d), t in tokens.items() if d == n}
        p.mask(state, 1, forwarded, p.encode(np.ones(SIZE), 1.0, 1.0, CLIP, LEVELS)[0])
    views = {1: ([1, 2, 4], [3, 5]), 2: ([1, 2, 4], [3, 5]), 4: ([1, 2, 4], [3, 5])}
    views |= {3: ([3, 5], [1, 2, 4]), 5: ([3, 5], [1, 2, 4])}
    signatures = {n: p.check(states[n], 1, live) for n, (live, _) in views.items()}
    replies = {
        n: p.unmask(states[n], 1, live, dropped, signatures) for n, (live, dropped) in views.items()
    }
    seed_shares, key_shares = {}, {}
    for holder, (ids, shares) in replies.items():
        for node, share in zip(ids, shares):
            kind = seed_shares if p.digest(share) == book[node].seed_hashes[holder] else key_shares
            kind.setdefault(node, []).append(share)
    assert len(seed_shares[1]) == 2 and len(key_shares[1]) == 1  # the seed, not the key
    assert all(min(len(seed_shares.get(n, [])), len(key_shares.get(n, []))) < 2 for n in hoods)
