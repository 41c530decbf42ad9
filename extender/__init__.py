"""extender adapter."""
