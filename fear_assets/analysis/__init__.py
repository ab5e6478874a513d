"""Protocol 6.1-6.2, D3/D3b: the registered confirmatory models and their contrasts."""
