"""Carrying out a plan: the run, its launches and points, on one device, several, or a Ray cluster."""
