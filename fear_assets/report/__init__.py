"""The researcher's view (issue 15): figures, the Stage 2 report and the data record, as pure functions."""
