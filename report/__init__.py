"""The report: scores stored runs against their hypotheses and renders tables, charts and the site."""
