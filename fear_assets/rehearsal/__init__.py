"""Rehearsals: a registered family at its registered shape on random-weight stand-ins (tooling,
not science: outside the registered code hash)."""
