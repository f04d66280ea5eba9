"""Scoring: one hypothesis against one run -> its Score: the study context, the prediction resolved,
the measured sides (a capacity's too), premises, and the score's numbers as text."""
