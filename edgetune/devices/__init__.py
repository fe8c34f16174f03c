"""Devices and the transports that reach them."""
