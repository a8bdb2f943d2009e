"""A run and its directory: the paths in it, the guard that claims it, and the one place that
decides what a run resumes from."""
