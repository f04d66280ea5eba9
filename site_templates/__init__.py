"""Jinja templates of the site and its vendored static assets (see report/pages/site.py); not code."""
