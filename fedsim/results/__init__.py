"""What a run leaves: results.json and its summary (``outputs``), sweep comparisons and their
statistics, per-exchange metric sinks (CSV, TensorBoard, MLflow)."""
