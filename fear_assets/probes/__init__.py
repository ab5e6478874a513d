"""Protocol 4.5 Branch 3 (carriage), 6.1 (H4 rules), 6.3 (pilot decoding and ceiling)."""
