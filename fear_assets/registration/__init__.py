"""D6 integrity: the frozen registration record and the freeze check."""
