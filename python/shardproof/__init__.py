"""shardproof's Python side.

The pure-Python package holds the trace collector (`shardproof.trace`); a compiled extension may
later be installed beside it, but nothing here depends on one.
"""

__version__ = "0.1.0"
