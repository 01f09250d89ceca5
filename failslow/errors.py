"""Exceptions shared by the core and the CLI.

`InputError` means the caller handed us something we refuse (bad file, bad spec, inconsistent
layout). The CLI turns it into a one-line message on stderr and exit status 2.
"""


class InputError(ValueError):
    """Bad user input: reported as a clear message and exit status 2."""
