"""What keeps a run private: central DP and its noise (``dp``), the run's secret, the empirical privacy
audit and CKKS homomorphic averaging (``he``)."""
