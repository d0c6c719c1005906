"""What a run leaves: results.json and its summary (``outputs``), where it comes from (``provenance``),
sweep comparisons and their statistics, per-exchange metric sinks (CSV, TensorBoard, MLflow)."""
