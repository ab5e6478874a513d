"""The power gate (protocol 6.3, Appendix C step 3; DECISIONS 7): the registered Monte Carlo
simulation. ``design`` builds the registered design at a frame count, ``generator`` draws
outcomes from the analysis models at the pilot estimates, ``runner`` fits each dataset with
the registered model (compiled once per shape and process), ``targets`` holds 6.3's targets
and rules as pure functions of stored labels, and ``store`` writes one Parquet file per batch.
"""
