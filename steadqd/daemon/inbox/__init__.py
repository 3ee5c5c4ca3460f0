"""The watch folder: a folder whose completed files become jobs, one job per file.

Configured by a queue file's ``inbox:`` section and run by ``steadqd worker``,
``steadqd run`` or ``steadqd inbox``. Its modules, by step:

* ``watch``: the role and its thread: which files arrive, when each has settled,
  what the journal and ``status`` say about it;
* ``files``: one file's steps: intent record, move, enqueue with the recorded id;
* ``linux``: the one Linux call Python's ``os`` lacks (renameat2).
"""
