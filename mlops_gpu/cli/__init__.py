"""The ``mlops-gpu`` command line (edge layer). Heavy modules are imported inside commands so
that ``mlops-gpu --help`` stays fast."""
