"""Pure statistics of the report: intervals at the level that varies (launches between, repeats within),
the stopping rule's looks, the power of a verdict, and the verdict rule itself."""
