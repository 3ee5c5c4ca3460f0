"""The crash lab's pytest tier: one test module per lane; the harness is :mod:`tests.lab`."""
