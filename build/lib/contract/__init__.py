"""The contract between lowwater's two levels: packet field catalog, query model and wire format.

Both ``low_level`` and ``high_level`` import from here and never from each other.
"""
