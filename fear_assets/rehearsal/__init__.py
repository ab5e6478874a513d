"""Rehearsals: a registered family at its registered shape on random-weight stand-ins, before
anyone spends GPU hours (``fear rehearse``).

Tooling, not science: nothing here decides a document, a score, a gate, a label or a reading,
so the package is outside the registered code hash (``registration.record.CODE_NOT_HASHED``)
and changing it never changes a registered family's hash. ``models`` builds the stand-in
checkpoints; ``workspace`` writes a rehearsal's settings, site file and instance; ``run`` runs
it through the product's own commands and measures it.
"""
