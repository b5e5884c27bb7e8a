"""Target-driven compression: a latency table measured on the user's runtime, a search, the chosen model."""
