"""The embedded broker: kombu's filesystem transport, with each message written whole.

kombu's filesystem transport writes a message by opening its final file name
and then writing into it; a consumer polling the folder may move and read the
file in between, find it empty, and fail on the JSON -- an error Celery's
consumer treats as unrecoverable, so the worker stops. It happened under a
burst of deliveries (``bench sqlite``). Here a message is written under a
name no consumer picks up and renamed into place when complete (a rename is
atomic within one file system), so a consumer sees whole messages or none.

A consumer takes messages cheaply and safely:

- it lists the folder once and takes the listed messages in order until they
  run out, rather than listing and sorting the whole folder for every
  message (kombu's way: with a backlog of 2,000 files an idle worker spent
  a quarter of a core polling);
- it claims a message by renaming it into the broker's own ``processed``
  folder, on the same file system, so of two consumers exactly one wins.
  kombu moves it to the system's temporary folder, which, on another file
  system, is a copy that two consumers can both make;
- a message it cannot read (an empty or cut file: after a power cut, the
  rename can reach the disk before the data) is moved to ``damaged`` and
  logged, not raised: Celery stops a worker on such an error, and the
  message's inbox row is still ``queued``, so the sweeper sends it again.

A consumer also stops waiting when its worker stops. Celery's loop for a
transport like this one (``synloop``) waits in ``drain_events`` for up to
2 s between its checks for a shutdown, and on the way out waits once more;
with Celery's timer that made an idle worker take 4-5 s to finish a warm
shutdown, and honcho (``taskhook start``) kills a process still running
5 s after SIGTERM. :func:`stop_waiting`, called on Celery's
``worker_shutting_down`` (``worker.celery_app``), ends every wait at once:
``drain_events`` times out without taking another message, so
the worker finishes what it runs, acknowledges it, and exits.

Durability: nothing here is fsynced. A message survives the crash of the
process that wrote it (it is in the kernel's page cache once renamed); a
power cut or an OS crash can lose messages written since the file system
last flushed. The inbox row, not the message, is what must survive: the
sweeper re-sends every row left ``queued`` (docs/performance.md, section 6).

Selected by the Celery setting ``broker_transport`` whenever the broker URL
is ``filesystem://`` (``models.broker.connection.broker_transport``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections import deque
from queue import Empty
from time import monotonic, sleep

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

#: A consumer takes only ``<stamp>_<uuid>.<queue>.msg`` files; this suffix
#: keeps a message it must not take yet out of its sight.
PARTIAL_SUFFIX = ".part"
#: Beside the queue folder: the messages a consumer could not read.
DAMAGED_FOLDER = "damaged"

#: True once the process's worker is stopping: no consumer waits for a message any more.
#: A plain flag, not a ``threading.Event``: it is set from a signal handler, which
#: runs in the main thread, where the consumer may be inside the Event's own lock.
_stopping = False


def stop_waiting() -> None:
    """End every consumer's wait for messages in this process, now and from now on."""
    global _stopping
    _stopping = True


class Channel(filesystem.Channel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The broker's folders are made where it is opened, so a fresh
        # checkout runs with nothing prepared (kombu makes none of them but
        # ``control``, and that one without its parents).
        for folder in (
            self.data_folder_in,
            self.data_folder_out,
            self.processed_folder,
            self.control_folder,
        ):
            os.makedirs(folder, exist_ok=True)
        #: Per queue, the names listed last and not yet taken, oldest first.
        self._listed: dict[str, deque[str]] = {}

    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` on ``queue``: written aside, then renamed into place."""
        # kombu's naming, consumers taking the files in name order; the
        # milliseconds zero-padded, so that the order holds when they gain a digit.
        name = f"{round(monotonic() * 1000):015d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + PARTIAL_SUFFIX
        try:
            with open(partial, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.remove(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from error

    def _get(self, queue):
        """The next message of ``queue``, oldest first; ``queue.Empty`` when none."""
        listed = self._listed.setdefault(queue, deque())
        listed_afresh = not listed
        if listed_afresh:
            listed.extend(self._list(queue))
        while listed:
            message = self._take(listed.popleft())
            if message is not None:
                return message
            if not listed and not listed_afresh:
                # What was listed earlier is gone (other consumers took it): look once more.
                listed_afresh = True
                listed.extend(self._list(queue))
        raise Empty()

    def _list(self, queue):
        wanted = f"{queue}.msg"
        return sorted(
            name for name in os.listdir(self.data_folder_in) if name.partition(".")[2] == wanted
        )

    def _take(self, name):
        """The message in file ``name``, claimed by a rename; None when another
        consumer took it first or it cannot be read."""
        claimed = os.path.join(self.processed_folder, name)
        try:
            os.replace(os.path.join(self.data_folder_in, name), claimed)
        except FileNotFoundError:
            return None  # another consumer's
        except OSError as error:
            raise ChannelError(f"Cannot take {name!r} from the queue") from error
        try:
            with open(claimed, "rb") as file:
                payload = file.read()
        except OSError as error:
            raise ChannelError(f"Cannot read {claimed!r}") from error
        try:
            message = loads(bytes_to_str(payload))
        except ValueError:
            self._set_aside(claimed, name, len(payload))
            return None
        if not self.store_processed:
            with contextlib.suppress(FileNotFoundError):
                os.remove(claimed)
        return message

    def _set_aside(self, claimed, name, size):
        damaged = os.path.join(os.path.dirname(self.data_folder_in), DAMAGED_FOLDER)
        os.makedirs(damaged, exist_ok=True)
        os.replace(claimed, os.path.join(damaged, name))
        log.error(
            "broker message %s is not whole (%d bytes): moved to %s; its deliveries stay "
            "queued in the inbox, and the sweeper sends them again",
            name,
            size,
            damaged,
        )


class Transport(filesystem.Transport):
    Channel = Channel

    def drain_events(self, connection, timeout=None):
        """kombu's polling loop, which also ends when :func:`stop_waiting` was
        called: at once, and before taking another message."""
        started = monotonic()
        interval = self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        while not _stopping:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and monotonic() - started >= timeout:
                    raise TimeoutError() from None
                if interval:
                    sleep(interval)
            else:
                return
        raise TimeoutError()
