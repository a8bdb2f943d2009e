"""`python scripts/train.py ...` runs `foxhunt train ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("train")
