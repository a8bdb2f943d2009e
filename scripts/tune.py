"""`python scripts/tune.py ...` runs `foxhunt tune ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("tune")
