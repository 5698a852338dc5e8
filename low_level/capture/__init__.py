"""Capture: packet sources filling a fixed-size ring, fanout over worker processes."""
