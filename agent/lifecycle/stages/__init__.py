"""One module per lifecycle state: each takes the typed record of earlier stages and returns its event."""
