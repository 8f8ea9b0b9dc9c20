"""``python -m refmount`` and the ``refmount`` command: credentials on the command line are
masked and SIGUSR1/SIGUSR2 ignored before the CLI's imports (a few tenths of a second) run."""

import sys

from refmount.base.process import ignore_user_signals, without_pandas
from refmount.cli.cmdline import hide_credentials


def main() -> int:
    warning = hide_credentials()
    ignore_user_signals()
    without_pandas()
    from refmount.cli.main import main as cli_main

    return cli_main(credentials_warning=warning)


if __name__ == "__main__":
    sys.exit(main())
