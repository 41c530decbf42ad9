"""Adapters between the official kubernetes client and the pure core."""
