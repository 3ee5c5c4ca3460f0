"""Tests of packaging/: the Debian package and the appliance bundle (docs/packaging.md)."""
