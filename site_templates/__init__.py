"""Jinja templates of the site and its vendored static assets (see report/site.py); not code."""
