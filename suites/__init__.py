"""Built-in suite files (*.toml); shipped as package data."""
