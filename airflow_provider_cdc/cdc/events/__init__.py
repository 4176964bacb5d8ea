"""The Debezium event: the envelope's fields and schema, which columns are kept or masked, how
values are written (value modes).

May import: ``basics``.
"""
