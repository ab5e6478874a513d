"""The analyzer (standard library only): integrity checks, label validity, estimands."""
