"""The parts of :mod:`kbcore.filters`: :mod:`.where` (the compiler), :mod:`.cache` (compiled
filters and the native ``Filter``), :mod:`.iso` (ISO-8601 instants, native). Import the public
names from :mod:`kbcore.filters`."""
