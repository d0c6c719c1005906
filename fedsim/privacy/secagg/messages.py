"""Keys of SecAgg+ messages, imported by the server half (``fedsim_strategies/secagg.py``) and the
client layer (``fedsim/runtime/secagg_layer.py``); the records and the round are the shared keys
(``fedsim/message_keys.py``)."""

from fedsim.message_keys import CONFIG, METRICS, SERVER_ROUND  # noqa: F401 (the shared keys SecAgg messages use)

OP = "secagg-op"  # config: the stage a message asks for (ADVERTISE, SHARE, MASK, CHECK, UNMASK)
ADVERTISE = "advertise"  # OP: make this round's key pairs, reply their public halves
SHARE = "share"  # OP: Shamir-share the self-mask seed and the mask key among the neighbours
MASK = "mask"  # OP (a train message): train, reply the masked, quantized update
CHECK = "check"  # OP: sign the live set the server names (the consistency check)
UNMASK = "unmask"  # OP: the shares of the live neighbours' seeds and the dropped ones' keys
ROUND = "secagg-round"  # config: the round the message belongs to (echoed in every reply)
SELF = "secagg-self"  # config: the id this node has in the round (its node id)
THRESHOLD = "secagg-threshold"  # config (share): t, shares needed to reconstruct a secret
IDS = "secagg-ids"  # config: node ids (share: the neighbourhood; unmask: who answered)
MASK_KEYS = "secagg-mask-keys"  # config / reply (advertise, unmask: the next round's): mask keys
SHARE_KEYS = "secagg-share-keys"  # config / reply: EC public keys that encrypt the shares
SIGN_KEYS = "secagg-sign-keys"  # config / reply: EC public keys of the consistency signatures
KEY_TRIO = (MASK_KEYS, SHARE_KEYS, SIGN_KEYS)  # a node's public keys, in protocol.KINDS' order
CIPHERTEXTS = "secagg-ciphertexts"  # config / reply: Fernet tokens of (src, dst, shares)
DESTINATIONS = "secagg-destinations"  # reply (share): the neighbour each ciphertext is for
SEED_HASHES = "secagg-seed-share-hashes"  # reply (share): SHA-256 of each seed share, by neighbour
KEY_HASHES = "secagg-key-share-hashes"  # reply (share): SHA-256 of each key share, by neighbour
SEED_COMMITMENT = "secagg-seed-commitment"  # reply (share): SHA-256 of the self-mask seed
SOURCES = "secagg-sources"  # config (mask): the neighbour each forwarded ciphertext comes from
MASKED_WITH = "secagg-masked-with"  # reply (mask): the neighbours whose pairwise masks it added
MASKED = "secagg-masked"  # ArrayRecord of a mask reply: VECTOR
VECTOR = "vector"  # MASKED entry: uint32, the weight level then the update's levels, masked
CLIP = "secagg-clip"  # config (mask): c, each weighted value clipped to [-c, c]
LEVELS = "secagg-levels"  # config (mask): L, quantization levels over [-c, c]
MAX_WEIGHT = "secagg-max-weight"  # config (mask): the weight a client's update is scaled against
WEIGHT_KEY = "secagg-weight-key"  # config (mask): the reply metric that names the weight
CLIPPED = "secagg-clipped"  # reply metric (mask): values clipped to [-c, c]
LIVE = "secagg-live"  # config (check, unmask): the nodes whose masked inputs are summed
DROPPED = "secagg-dropped"  # config (unmask): the nodes whose pairwise masks are removed
SIGNATURES = "secagg-signatures"  # config (unmask) / reply (check): ECDSA over the live set
SHARES = "secagg-shares"  # reply (unmask): one share per id of IDS
DDP_NOISE = "secagg-ddp-noise-multiplier"  # config (mask, distributed DP): sigma of the sum, in C
DDP_BOUND = "secagg-ddp-bound"  # config (mask, distributed DP): B, a row's integer norm bound
DDP_MIN_LIVE = "secagg-ddp-min-live"  # config (mask, distributed DP): the least live set signed
DDP_COLLUDERS = "secagg-ddp-colluders"  # config (mask, distributed DP): clients assumed unnoised
DDP_CLIP = "secagg-ddp-clip-norm"  # config (mask, distributed DP): C, each row's L2 clip
DDP_SIMPLEX = "secagg-ddp-simplex"  # config (mask, distributed DP): rows non-negative first
DDP_ARRAY = "secagg-ddp-array"  # config (mask, distributed DP): the reply array holding the rows
