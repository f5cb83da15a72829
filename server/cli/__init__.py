"""The ``fedsketch`` command line, one module per command group; :mod:`.main` holds the app."""
