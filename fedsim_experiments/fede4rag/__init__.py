"""fede4rag."""
