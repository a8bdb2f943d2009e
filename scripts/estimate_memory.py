"""`python scripts/estimate_memory.py ...` runs `foxhunt estimate-memory ...` (old lines)."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("estimate-memory")
