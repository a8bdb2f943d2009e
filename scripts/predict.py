"""`python scripts/predict.py ...` runs `foxhunt predict ...`, for old command lines."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main("predict")
