"""The shared base every stage stands on: expected errors (`base.errors`), the one number formatter
(`base.format`), machine settings (`base.settings`) and the package version."""

__version__ = "0.1.0"
