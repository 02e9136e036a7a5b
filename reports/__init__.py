"""Views of stored results: frames, terminal tables, exports."""
