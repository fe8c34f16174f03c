"""edgetune: verified, honestly measured inference tuning for the devices models ship on."""

__version__ = "0.1.0"
