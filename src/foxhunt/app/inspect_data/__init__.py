"""`foxhunt inspect`: what foxhunt will make of a data file, before a run."""
