"""The step-time model's ledger (`studyc model`): stored points, fits kept on disk, leave-one-study-out
validation, and its tables and site page."""
