"""Dialogue response generation and its trust evaluation (FedDTRE, METHODS.md section 2)."""
