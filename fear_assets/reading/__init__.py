"""Protocol 6.2 and 8: the decision rule and the pre-committed Section 8 reading."""
