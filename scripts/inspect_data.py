"""`python scripts/inspect_data.py ...` runs `foxhunt inspect ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("inspect")
