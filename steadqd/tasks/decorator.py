"""The decorator: a function bound to a queue, its calls published as JSON jobs, and the task's name,
which the producer and the worker must agree on."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from steadqd.backend import Backend, open_queue
from steadqd.constants import DeadReason
from steadqd.errors import InvalidInput
from steadqd.tasks.job import Bury, Job, WorkStats
from steadqd.tasks.worker import Worker

JSON_TYPE = "application/json"


class Task:
    """A function bound to a queue: ``enqueue`` makes a JSON job of its arguments, ``work`` runs them.

    A job's payload is ``{"task": NAME, "args": [...], "kwargs": {...}}``
    (``application/json``), with ``task=NAME`` in its metadata so that
    ``steadq ls`` and the journal tell tasks apart; a worker of one task
    buries (consumer_rejected) a job meant for another, since it could
    only fail on every attempt.
    """

    __name__: str  # and the wrapped function's other attributes: functools.update_wrapper copies them

    def __init__(
        self,
        fn: Callable[..., object],
        queue: str,
        *,
        name: str | None = None,
        max_attempts: int = 3,
        open_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.queue = queue
        self.name = name or f"{_module_name(fn)}.{fn.__qualname__}"
        self.max_attempts = max_attempts
        self.open_options = dict(open_options or {})
        self._producer: Backend | None = None
        self._producer_lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> object:
        """A direct call runs the function here, as if it were not a task."""
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> str:
        """Publish a job calling the function with these arguments; returns the job id."""
        return self.schedule(args=args, kwargs=kwargs)

    delay = enqueue  # the name celery users reach for

    def schedule(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        delay: float = 0.0,
        metadata: Mapping[str, bool | int | str | bytes] | None = None,
        max_attempts: int | None = None,
    ) -> str:
        """Publish with options: run no earlier than ``delay`` s from now, extra metadata."""
        try:
            body = json.dumps({"task": self.name, "args": list(args), "kwargs": dict(kwargs or {})})
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"the arguments of task {self.name} are not JSON-serialisable: {e}") from e
        meta = {"task": self.name, **(metadata or {})}
        with self._producer_lock:
            if self._producer is None:
                self._producer = open_queue(self.queue, **self.open_options)
            return self._producer.enqueue(
                body.encode(),
                content_type=JSON_TYPE,
                metadata=meta,
                max_attempts=self.max_attempts if max_attempts is None else max_attempts,
                delay=delay,
            )

    def close(self) -> None:
        """Close the producer handle (it is reopened by the next enqueue)."""
        with self._producer_lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None

    def worker(self, **options: Any) -> Worker:
        options.setdefault("open_options", self.open_options)
        handler = self._run_async if asyncio.iscoroutinefunction(self.fn) else self._run
        return Worker(self.queue, handler, **options)

    def work(self, **options: Any) -> WorkStats:
        """Run this task's jobs until SIGTERM/SIGINT; options as :class:`Worker`."""
        return self.worker(**options).run()

    async def work_async(self, **options: Any) -> WorkStats:
        return await self.worker(**options).run_async()

    def _arguments(self, job: Job) -> tuple[list[Any], dict[str, Any]]:
        body = job.json()  # BadPayload buries what cannot be decoded
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("args"), list)
            or not isinstance(body.get("kwargs"), dict)
        ):
            raise Bury(f"job {job.id} is not a task call (task, args, kwargs)", DeadReason.UNSUPPORTED_CONTENT_TYPE)
        if body.get("task") != self.name:
            raise Bury(f"job {job.id} is for task {body.get('task')!r}, this worker runs {self.name!r}")
        return body["args"], body["kwargs"]

    def _run(self, job: Job) -> object:
        args, kwargs = self._arguments(job)
        return self.fn(*args, **kwargs)

    async def _run_async(self, job: Job) -> object:
        args, kwargs = self._arguments(job)
        result = self.fn(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result


def _module_name(fn: Callable[..., object]) -> str:
    """The module a task's name begins with, the same whether its file is run or imported.

    Run as a script a function's module is ``__main__``, so a worker that
    imports the file would know the task by another name and bury its jobs.
    ``python -m pkg.mod`` says its name (``__spec__``); a file run by its path
    is named as an import finds it: its stem, under each enclosing directory
    that is a package (has ``__init__.py``). Without a file (an interactive
    session, ``python -c``) there is no name to derive: ``name=`` is required."""
    module = fn.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name).removesuffix(".__main__")
    path = getattr(main, "__file__", None)
    if not path:
        raise InvalidInput(
            f"task {getattr(fn, '__qualname__', fn)!r} is defined in __main__ with no file to name it by: "
            "give the task a name: @task(queue, name=...) (the producer and the worker must agree on it)"
        )
    directory, file = os.path.split(os.path.abspath(path))
    parts = [os.path.splitext(file)[0]]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    return ".".join(parts)


def task(
    queue: str, *, name: str | None = None, max_attempts: int = 3, **open_options: Any
) -> Callable[[Callable[..., object]], Task]:
    """Decorator: make a function a :class:`Task` of ``queue``."""

    def wrap(fn: Callable[..., object]) -> Task:
        return Task(fn, queue, name=name, max_attempts=max_attempts, open_options=open_options)

    return wrap
