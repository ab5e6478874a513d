"""Stage "pilot" (protocol 4.2-4.6, 5; Appendix C steps 1-2): the pilot frames' trial table
and scores, the document-free checks, matching, binding, report scoring, the depth band,
the positive controls and the pilot probes. Everything the registration record reads."""
