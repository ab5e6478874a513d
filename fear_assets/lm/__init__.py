"""Protocol 4.1-4.5: model registry, tokenizers and the scoring engine."""
