"""`python scripts/interpret.py ...` runs `foxhunt interpret ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("interpret")
