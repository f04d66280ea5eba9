"""studyc: performance studies of LLM serving as files; the package version."""

__version__ = "0.1.0"
