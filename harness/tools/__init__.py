"""Tools around the engine: the pytest plugin."""
