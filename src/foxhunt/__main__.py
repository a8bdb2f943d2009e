"""`python -m foxhunt <command> ...` is `foxhunt <command> ...`."""

from foxhunt.app.commands import main

if __name__ == "__main__":
    main()
