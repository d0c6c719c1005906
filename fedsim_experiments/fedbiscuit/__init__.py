"""fedbiscuit."""
