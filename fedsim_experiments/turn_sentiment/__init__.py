"""turn_sentiment."""
