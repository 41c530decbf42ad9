"""inspect_cli adapter."""
