"""fedsim: Flower-based federated simulation platform for privacy-preserving conversational AI."""

__version__ = "0.1.0"
