"""fedtp."""
