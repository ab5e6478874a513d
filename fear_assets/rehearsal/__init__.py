"""Rehearsal tooling: what a dress rehearsal of a registered family runs on.

Not science and not under the registered code hash (``registration.record.CODE_NOT_HASHED``):
nothing here decides a document, a score, a gate, a label or a reading. It builds tiny
random-weight checkpoints of the registered architectures and places them through the site
configuration, so the product's own code runs the registered design end to end before any
GPU hour is spent. Every output made with them is meaningless and says "rehearsal".
"""
