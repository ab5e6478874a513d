"""Protocol 4.2-4.6, 5, 6.3: the pilot stage and the registration gates."""
