"""The package version, in its own module so that code inside the package never imports the root."""

__version__ = "0.1.0"
