"""Flower's SecAgg+ primitives that fedsim's secure aggregation (``fedsim/privacy/secagg/``)
reuses: ECDH key agreement with HKDF and Fernet's authenticated encryption of the shares, the
share's framing with its source and destination, the EC key pairs and ECDSA signatures of
Flower's node authentication, and the stochastic quantization of its SecAgg+ mod. Flower keeps them outside its
public API (``flwr.common.secure_aggregation``, ``flwr.supercore.primitives``)."""

from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
    sign_message,
    verify_signature,
)

__all__ = [
    "bytes_to_private_key",
    "bytes_to_public_key",
    "decrypt",
    "encrypt",
    "generate_key_pairs",
    "generate_shared_key",
    "private_key_to_bytes",
    "public_key_to_bytes",
    "quantize",
    "share_keys_plaintext_concat",
    "share_keys_plaintext_separate",
    "sign_message",
    "verify_signature",
]
