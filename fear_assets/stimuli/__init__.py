"""Protocol 4.2-4.4: the stimulus bank (frames, events, templates) and the distractor."""
