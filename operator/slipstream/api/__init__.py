"""api stage of Slipstream (see docs/DESIGN.md)."""
