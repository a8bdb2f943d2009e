"""`python scripts/export.py ...` runs `foxhunt export ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("export")
