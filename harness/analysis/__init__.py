"""The statistics over measured samples: intervals, fits, process-level bootstrap."""
