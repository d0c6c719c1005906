"""feddtre."""
