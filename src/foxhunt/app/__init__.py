"""The commands, one package each (`app/<command>/`, its command line in `command.py`), what
they share (`render`), and the entry-point plumbing (`cli`, `commands`)."""
