"""Keys of HE averaging messages, imported by the server half (``fedsim_strategies/he_fedavg.py``)
and the client half (``fedsim/privacy/he/client.py``); the records and the round are the shared keys
(``fedsim/message_keys.py``)."""

from fedsim.message_keys import CONFIG, METRICS, SERVER_ROUND  # noqa: F401 (the shared keys HE messages use)

OP = "he-op"  # config: QUERY operation of the chunk phase
ENCRYPT = "encrypt"  # OP value: send chunk `CHUNK` of the pending update, encrypted
INSTALL = "install"  # OP value: decrypt an aggregate chunk into the global copy
HE_ROUND = "he"  # config (train): this round averages under HE
GLOBAL_ROUND = "he-global-round"  # config: the round whose aggregate to start from / evaluate (0: initial model)
INLINE_FLOATS = "he-inline-floats"  # config (train): updates of up to this many floats go encrypted in the reply
INSTALL_ROUND = "he-install-round"  # config (train): the round of the aggregate the message carries (CIPHERTEXTS)
CHUNK = "chunk"  # config: chunk index
CHUNK_FLOATS = "chunk-floats"  # config: floats per chunk
NUM_CHUNKS = "num-chunks"  # config: chunks of the update
NUM_FLOATS = "num-floats"  # config / metrics: floats of the flat update
KEY_ID = "he-key-id"  # config of server messages / CONTEXT entry of encrypt replies: ckks.key_id
CIPHERTEXTS = (
    "ciphertexts"  # ArrayRecord: CIPHERTEXT_BYTES and CIPHERTEXT_LENGTHS (ckks.blobs_record)
)
CIPHERTEXT_BYTES = "bytes"  # CIPHERTEXTS entry: uint8, the serialized ciphertexts back to back
CIPHERTEXT_LENGTHS = "lengths"  # CIPHERTEXTS entry: int64, each ciphertext's bytes, in order
CONTEXT = "he"  # ConfigRecord of a train reply (public context) / an encrypt reply (KEY_ID)
PUBLIC_CONTEXT = "public-context"  # CONTEXT entry: the serialized public CKKS context
ENCRYPT_SECONDS = "encrypt-seconds"
DECRYPT_SECONDS = "decrypt-seconds"
