"""Protocol 4.3-4.4, 4.7-4.8, D2: the trial design, documents, masking and accounting."""
