"""cli: the commands — ``refmount`` (mount), ``serve``, ``verify``, ``inspect``, ``expand``,
``stats`` (``main``), starting what serves and waiting until it answers (``launch``), credentials
kept off the command line (``cmdline``), the tools that work on
sets without serving one (``tools``) and ``refmount.mounted``/``served`` (``api``). The top
layer: it may import every other.
"""
