"""Searching the knobs: the tuner and its race, the memory fit, the scaling sweep."""
