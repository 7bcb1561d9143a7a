"""The embedded broker: kombu's filesystem transport, with each message written whole.

kombu's filesystem transport writes a message by opening its final file name
and then writing into it; a consumer polling the folder may move and read the
file in between, find it empty, and fail on the JSON -- an error Celery's
consumer treats as unrecoverable, so the worker stops. It happened under a
burst of deliveries (``bench sqlite``). Here a message is written under a
name no consumer picks up and renamed into place when complete (a rename is
atomic within one file system), so a consumer sees whole messages or none.

Selected by the Celery setting ``broker_transport`` whenever the broker URL
is ``filesystem://`` (``models.settings.Settings.broker_transport``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

#: A consumer takes only ``<stamp>_<uuid>.<queue>.msg`` files; this suffix
#: keeps a message it must not take yet out of its sight.
PARTIAL_SUFFIX = ".part"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` on ``queue``: written aside, then renamed into place."""
        # kombu's own naming: consumers take the files in name order.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
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


class Transport(filesystem.Transport):
    Channel = Channel
