"""Training recipes run by the trainer agent as child processes (`python -m ...`)."""
