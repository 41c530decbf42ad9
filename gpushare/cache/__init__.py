"""The extender's cluster state: per-GPU accounting with reservations (state) and the fit index (fitindex)."""
