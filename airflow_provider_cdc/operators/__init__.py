"""The operators, one module per concern: the base every capture operator extends (:mod:`.base`)
and the shared run of the two that land windows (:mod:`.landing`); setup, snapshot, window and
current state for every source; each source's health and maintenance operators; query-based
extraction."""
