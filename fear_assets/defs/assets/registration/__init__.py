"""Stage "registration" (protocol 6.3, Appendix C steps 3-4, D6): the power gate and the
Stage 1 registration record that freezes everything the confirmatory design reads."""
