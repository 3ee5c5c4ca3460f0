"""The crash lab (issue 8, lane 1): crash states computed from recorded syscall traces.

See docs/crash-lab.md for the persistence model and the commands. Modules:

* :mod:`tests.crash.recorder` turns the Linux layer's trace into a logical
  operation log (paths relative to the queue root, file contents by value);
* :mod:`tests.crash.model` enumerates the crash states a log allows under the
  persistence model and materialises them;
* :mod:`tests.crash.gates` recovers a materialised state and checks the gates;
* :mod:`tests.crash.workloads` defines what is recorded;
* :mod:`tests.crash.lab` drives everything (``python -m tests.crash.lab run``).
"""
