"""deviceplugin adapter."""
