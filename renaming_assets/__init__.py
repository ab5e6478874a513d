"""The anchor-fixed renaming study (``PROTOCOL.txt``): a second, fully offline protocol.

``generator``, ``auditor`` and ``analyzer`` (and ``settings``, ``precision``, ``bundle``,
``analyze``) use the Python standard library only; ``assets`` and ``definitions`` wrap
them as a Dagster code location. ``synthetic`` is a clearly marked test/demo responder.
"""
