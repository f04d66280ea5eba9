"""Planning: what would decide a hypothesis (blocks, launches, repeats) and at what GPU time, from the
spread and costs of earlier runs (`studyc plan --db`)."""
