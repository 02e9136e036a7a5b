"""Claims as data: the documents' trade-off claims, the evidence each draws on, and their verdicts."""
