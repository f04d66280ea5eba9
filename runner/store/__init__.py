"""The results database: the records that cross stages, the tables declared from them, the store."""
