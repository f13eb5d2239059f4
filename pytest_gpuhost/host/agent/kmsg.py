"""The kernel log's records: read(2) per record from its character device (1:11), non-blocking and
bounded, or the lines of a plain file in a fake tree; anything else in its place is refused."""

from __future__ import annotations

import errno
import os
import stat

from .errors import OpError, file_type
from .files import Files

KMSG_LIMIT = 64 * 2**20
"""Bytes of kernel log records: the largest ring buffer a kernel allows is 32 MiB."""
KMSG_DEVICE = (1, 11)


class KernelLog(Files):
    """``kmsg`` on the root's kernel log."""

    def kmsg(self, rel: str, limit: int = KMSG_LIMIT) -> list[str]:
        """The kernel log's records: read(2) per record from the device until EAGAIN, or the
        lines of a plain file in a fake tree. Anything else in its place is refused."""
        try:
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise self.fail("read", rel, exc) from None
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                data = self._bounded(fd, rel, limit)
                return data.decode("utf-8", errors="replace").splitlines()
            device = (os.major(info.st_rdev), os.minor(info.st_rdev))
            if not stat.S_ISCHR(info.st_mode) or device != KMSG_DEVICE:
                what = file_type(info.st_mode)
                if stat.S_ISCHR(info.st_mode):
                    what += f" {device[0]}:{device[1]}"
                raise OpError(f"cannot read {self.shown(rel)}: it is a {what}, not the kernel "
                              "log (character device 1:11)", errno.EINVAL)
            return self._records(fd, rel, limit)
        except OSError as exc:
            raise self.fail("read", rel, exc) from None
        finally:
            os.close(fd)

    def _records(self, fd: int, rel: str, limit: int) -> list[str]:
        records: list[str] = []
        size = 0
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                return records
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten while we read
                    continue
                raise
            if not chunk:
                return records
            size += len(chunk)
            if size > limit:
                raise OpError(f"cannot read {self.shown(rel)}: more than {limit} bytes of "
                              "records", errno.EFBIG)
            records.extend(chunk.decode("utf-8", errors="replace").splitlines())
