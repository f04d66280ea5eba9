"""The static site (`studyc site`): page models gathered from scores, charts and notes first, then
written through the Jinja templates."""
